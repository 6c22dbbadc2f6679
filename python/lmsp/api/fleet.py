"""A box of a fleet (settings ``box_id`` and ``peers``): a create naming an id of another
box is forwarded once to that box, where the id's items and KV file are; a list asked
through the router (header ``X-LMSP-Gather``) is gathered from every box into one page,
newest first. What a peer is sent carries ``X-LMSP-Forwarded``: it answers alone."""

from __future__ import annotations

import json
import logging
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode

import falcon

from lmsp import auth, ids
from lmsp.config import parse_peers
from lmsp.errors import BoxUnavailable, Unauthorized
from lmsp.fleet import keys, peers

from .common import Deps, read_body, set_json

log = logging.getLogger("lmsp.api")

RETRY_AFTER = 5
PEER_TIMEOUT = 300.0  # a forwarded plain create may generate for minutes
LIST_TIMEOUT = 10.0
#: the lists gathered across the fleet (ordered by id): their order when none is asked for
GATHERED = {"/v1/responses": "desc", "/v1/chat/completions": "asc"}


def named_id(body: Any) -> str | None:
    """The earlier id a create's body names (``previous_response_id`` or ``conversation``)."""
    if not isinstance(body, dict):
        return None
    earlier = body.get("previous_response_id")
    if isinstance(earlier, str):
        return earlier
    conversation = body.get("conversation")
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    return conversation if isinstance(conversation, str) else None


def cursor_for(cursor: str, box: str) -> str:
    """A list cursor as box ``box`` reads it: the same time, that box's id (an id made
    without a box id stays: every id of a box sorts after those)."""
    found = ids.OWNER.match(cursor)
    if not found:
        return cursor
    return cursor[: found.start(1)] + box + cursor[found.end(1) :]


def merge(pages: list[dict[str, Any]], limit: int, newest_first: bool = True) -> dict[str, Any]:
    """Pages of one list from several boxes as one page, newest first (or oldest first)."""
    rows = [row for page in pages for row in page.get("data", [])]
    rows.sort(key=lambda row: (ids.time_part(row["id"]), row["id"]), reverse=newest_first)
    data = rows[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(rows) > limit or any(page.get("has_more") for page in pages),
    }


class RevokedResource:
    """``GET /v1/fleet/revoked``: the clients this box paired and revoked, for its peers
    (``Authorization: Fleet TIME.SIGNATURE``, signed with the fleet key)."""

    scopes = {"GET": None}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        config = self.deps.config
        box = getattr(config, "box_id", "")
        key = keys.load(config.data_dir) if box else None
        if key is None or not keys.peer_ok(key, req.get_header("Authorization")):
            raise Unauthorized("this list is for the boxes of the fleet")
        revoked = [cid for cid in self.deps.store.revoked_client_ids() if ids.owner(cid) == box]
        set_json(resp, {"object": "fleet.revoked", "box": box, "revoked": revoked})


class FleetRouting:
    """Forwarding of creates and gathering of lists between the boxes of a fleet."""

    def __init__(self, config: Any) -> None:
        self.box: str = getattr(config, "box_id", "")
        self.peers = parse_peers(getattr(config, "peers", ""))
        self.max_body: int = config.max_body_bytes
        self.body_timeout: float = config.body_timeout

    def process_resource(
        self, req: falcon.Request, resp: falcon.Response, resource: object, params: dict[str, Any]
    ) -> None:
        if not self.peers or req.get_header(peers.FORWARDED):
            return
        if req.method == "POST" and req.uri_template in ("/v1/responses", "/v1/pair"):
            self._forward_create(req, resp)
        elif req.method == "GET" and req.uri_template in GATHERED and req.get_header(peers.GATHER):
            req.context.gather = True
            after = req.get_param("after")
            if after:
                # the local page starts at the same time (falcon's params are its dict)
                cast(dict[str, Any], req.params)["after"] = cursor_for(after, self.box)

    def _forward_create(self, req: falcon.Request, resp: falcon.Response) -> None:
        data = read_body(req, self.max_body, self.body_timeout)
        req.context.raw_body = data
        try:
            body = json.loads(data)
        except ValueError:
            return  # the responder refuses it
        owner = self._owner_named(req, body)
        if owner is None or owner == self.box or owner not in self.peers:
            return
        headers = {name: value for name in peers.PASSED if (value := req.get_header(name)) is not None}
        try:
            conn, answer = peers.send(self.peers[owner], "POST", req.relative_uri, headers, data, timeout=PEER_TIMEOUT)
        except peers.PeerDown as exc:
            log.warning("box %s cannot be reached: %s", owner, exc)
            raise BoxUnavailable(
                f"box {owner!r}, which this request names, cannot be reached", retry_after=RETRY_AFTER
            ) from None
        resp.status = answer.status
        for name in peers.KEPT:
            value = answer.getheader(name)
            if value is not None:
                resp.set_header(name, value)
        resp.stream = peers.chunks(conn, answer)
        resp.complete = True

    @staticmethod
    def _owner_named(req: falcon.Request, body: Any) -> str | None:
        """The box of the earlier id a create names, or of the pairing code redeemed."""
        if req.uri_template == "/v1/pair":
            code = body.get("code") if isinstance(body, dict) else None
            return auth.code_box(code) if isinstance(code, str) else None
        earlier = named_id(body)
        return ids.owner(earlier) if earlier else None

    def process_response(
        self, req: falcon.Request, resp: falcon.Response, resource: object, req_succeeded: bool
    ) -> None:
        if not getattr(req.context, "gather", False) or resp.status_code != 200 or not isinstance(resp.text, str):
            return
        pages = [json.loads(resp.text)]
        query = [(k, v) for k, v in parse_qsl(req.query_string, keep_blank_values=True) if k != "after"]
        after = req.get_param("after")
        headers = {"Authorization": req.get_header("Authorization") or ""}
        for box, address in self.peers.items():
            target = req.path + "?" + urlencode(query + ([("after", cursor_for(after, box))] if after else []))
            try:
                status, page = peers.get_json(address, target, headers, timeout=LIST_TIMEOUT)
            except peers.PeerDown as exc:
                log.warning("box %s cannot be reached: %s", box, exc)
                error = BoxUnavailable(f"box {box!r} cannot be reached: the list is not whole", retry_after=RETRY_AFTER)
                set_json(resp, error.body(), error.status, error.headers)
                return
            if status != 200:
                set_json(resp, page, status)
                return
            pages.append(page)
        limit = int(req.get_param("limit") or 20)
        order = req.get_param("order") or GATHERED.get(req.uri_template or "", "desc")
        set_json(resp, merge(pages, limit, newest_first=order == "desc"))
