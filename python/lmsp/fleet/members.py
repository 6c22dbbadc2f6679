"""Clients of the fleet on this box: a fleet token of a client paired on another box is
taken once its signature holds, and the client is copied into this box's store (its
tasks name it there); the clients the other boxes revoked are pulled from them every
:data:`PULL_SECONDS` and revoked here too."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from lmsp import auth, ids
from lmsp.config import parse_peers
from lmsp.errors import Unauthorized

from . import keys, peers

log = logging.getLogger("lmsp.fleet")

PULL_SECONDS = 1.0
PULL_TIMEOUT = 2.0
REVOKED_PATH = "/v1/fleet/revoked"


class FleetMembers:
    """Fleet tokens checked, the clients of other boxes copied, their revocations pulled."""

    def __init__(self, store: Any, key: bytes, box: str, others: dict[str, str]) -> None:
        self.store = store
        self.key = key
        self.box = box
        self.peers = others
        self.revoked: set[str] = set()  # clients of other boxes revoked there

    def authenticate(self, token: str) -> dict[str, Any]:
        """The client of a fleet token; Unauthorized when its signature fails, its client is
        unknown or revoked, or it would be an admin of another box (admins stay per box)."""
        found = keys.claims(self.key, token)
        if found is None:
            raise Unauthorized("unknown or revoked token")
        digest = auth.hash_token(found.local)
        client: dict[str, Any] | None = self.store.client_by_token_hash(digest)
        if client is not None and client["id"] == found.client_id:
            return client
        home = ids.owner(found.client_id)
        if client is not None or home == self.box or home not in self.peers or found.client_id in self.revoked:
            raise Unauthorized("unknown or revoked token")
        if auth.ADMIN in found.scopes:
            raise Unauthorized("an admin token is taken by its own box only")
        copied: dict[str, Any] | None = self.store.copy_client(
            client_id=found.client_id, name=found.name, scopes=found.scopes, token_hash=digest
        )
        if copied is None:
            raise Unauthorized("unknown or revoked token")
        return copied

    def pull(self) -> None:
        """The revocations of every peer, once; a peer that cannot be reached is asked again
        at the next pull."""
        for box, address in self.peers.items():
            try:
                status, body = peers.get_json(
                    address, REVOKED_PATH, {"Authorization": keys.peer_header(self.key)}, timeout=PULL_TIMEOUT
                )
            except peers.PeerDown:
                continue
            if status != 200 or not isinstance(body, dict):
                log.warning("box %s refused the revocations' pull (%s)", box, status)
                continue
            fresh = [cid for cid in body.get("revoked", []) if ids.owner(cid) == box and cid not in self.revoked]
            for client_id in fresh:
                self.store.revoke_copy(client_id)
            self.revoked.update(fresh)

    def _run(self) -> None:
        while True:
            try:
                self.pull()
            except Exception:  # the next pull tries again
                log.exception("pulling the fleet's revocations failed")
            time.sleep(PULL_SECONDS)

    def start(self) -> None:
        """Pull the peers' revocations from now on (a greenlet under gevent)."""
        if self.peers:
            threading.Thread(target=self._run, name="lmsp-fleet-revocations", daemon=True).start()


def members_for(config: Any, store: Any) -> FleetMembers | None:
    """The fleet side of this box's authentication (None: not a box of a fleet)."""
    box = getattr(config, "box_id", "")
    key = keys.load(config.data_dir) if box else None
    if key is None:
        return None
    return FleetMembers(store, key, box, parse_peers(getattr(config, "peers", "")))
