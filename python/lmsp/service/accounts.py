"""Pairing and clients (LMSP B.2): codes made and redeemed, clients listed and
revoked. The store keeps digests only: a code or a token exists in full only in
the answer that gives it (or, under an idempotency key, derived again from the
service's secret for a retry)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from lmsp import auth
from lmsp.errors import InvalidRequest, NotFound, Unavailable
from lmsp.fleet import keys
from lmsp.wire.pairing import PairingAsk, RedeemAsk

if TYPE_CHECKING:
    from lmsp.store import Store

log = logging.getLogger("lmsp.service")

FAILURE_WINDOW_SECONDS = 60


class AccountService:
    """Pairing codes, their redemption, and the clients they made."""

    def __init__(self, config: Any, store: Store, clock: Callable[[], float]) -> None:
        self.config = config
        self.store = store
        self.clock = clock

    def create_code(self, asked: PairingAsk, code: str | None = None) -> dict[str, Any]:
        """A new pairing code (``code``: the one derived from the request's key)."""
        now = self.clock()
        code = code or self.boxed_code(auth.new_pairing_code())
        expires_at = int(now) + asked.expires_in
        row = self.store.create_pairing(
            code_hash=auth.hash_code(code), scopes=asked.scopes, expires_at=expires_at, name=asked.name
        )
        out = {
            "object": "pairing",
            "code": code,
            "scopes": asked.scopes,
            "name": asked.name,
            "created_at": int(now),
            "expires_at": expires_at,
        }
        if isinstance(row, dict) and row.get("id"):
            out["id"] = row["id"]
        return out

    def redeem(self, asked: RedeemAsk, token: str | None = None) -> dict[str, Any]:
        """A client for the code (``token``: the one derived from the request's key)."""
        token = token or auth.new_token()
        try:
            client = self.store.redeem_pairing(
                code_hash=auth.hash_code(asked.code),
                client_name=asked.client_name,
                token_hash=auth.hash_token(token),
                max_failures=self.config.pairing_max_attempts,
                window=FAILURE_WINDOW_SECONDS,
            )
        except NotFound:
            log.warning("failed pairing attempt")
            raise InvalidRequest("the pairing code is unknown, already used or expired", param="code") from None
        log.info("client paired", extra={"client_id": client["id"]})
        return self.fleet_token(
            {
                "object": "client_token",
                "client_id": client["id"],
                "client_name": client["name"],
                "token": token,
                "scopes": list(client["scopes"]),
            }
        )

    def boxed_code(self, code: str) -> str:
        """``code`` with this box's id before it, on a box of a fleet."""
        return auth.boxed_code(code, getattr(self.config, "box_id", ""))

    def fleet_token(self, answer: dict[str, Any]) -> dict[str, Any]:
        """On a box of a fleet, ``answer`` (a client token) with the fleet token that every
        box takes, signed with the fleet key; an admin's token stays its box's own."""
        box = getattr(self.config, "box_id", "")
        key = keys.load(self.config.data_dir) if box else None
        local = answer.get("token")
        if key is None or not isinstance(local, str) or local.startswith(keys.FLEET_PREFIX):
            return answer
        if auth.ADMIN in answer["scopes"]:
            return answer
        signed = keys.token(key, answer["client_id"], answer["client_name"], list(answer["scopes"]), local)
        return {**answer, "token": signed}

    def secret(self) -> bytes:
        """The service's secret; 503 (and the reason in the log) when it cannot be read."""
        try:
            return auth.service_secret(self.config.data_dir)
        except OSError as exc:
            log.error("pairing under an Idempotency-Key needs the service key: %s", exc)
            raise Unavailable(
                "pairing under an Idempotency-Key is unavailable: the service key cannot be "
                "read (see the service log); retry without the key",
                retry_after=60,
            ) from None

    def key_ttl(self) -> float:
        """How long a pairing request's Idempotency-Key answers a retry: the life of a
        code, at most the service's key lifetime (a code with its key gives the
        value again, so not for longer than a retry needs)."""
        config = self.config
        return min(float(config.pairing_ttl_seconds), float(config.idempotency_ttl_hours) * 3600.0)

    def clients(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.store.list_clients()
        return rows

    def client(self, client_id: str) -> dict[str, Any]:
        for row in self.clients():
            if row["id"] == client_id:
                return row
        raise NotFound(f"no client with id {client_id!r}")

    def set_limits(self, client_id: str, limits: dict[str, int | None], by: str) -> dict[str, Any]:
        """Change a client's priority and limits (those given; None: no limit); the client
        after the change. A task already queued keeps its place."""
        self.store.set_limits(client_id, **limits)
        log.info("client limits set", extra={"limited_client_id": client_id, "limits": limits, "by": by})
        return self.client(client_id)

    def revoke(self, client_id: str, by: str) -> dict[str, Any]:
        """Revoke a client: its token stops working at once, its open streams end."""
        row: dict[str, Any] = self.store.revoke_client(client_id)
        log.info("client revoked", extra={"revoked_client_id": client_id, "by": by})
        return row
