"""Pairing and clients (LMSP B.2): ``/v1/pairings``, ``/v1/pair``, ``/v1/clients``."""
from __future__ import annotations

import logging
import unicodedata

import falcon

from lmsp import auth
from lmsp.errors import InvalidRequest, NotFound

from . import idempotency
from .common import Deps, caller, check_id, get_int, get_str, reject_unknown, set_json

log = logging.getLogger("lmsp.api")

DEFAULT_PAIRING_SCOPES = ["responses:write", "responses:read", "models:read"]
FAILURE_WINDOW_SECONDS = 60


def client_object(row: dict) -> dict:
    out = {k: v for k, v in row.items() if k not in ("token_hash",)}
    out.setdefault("object", "client")
    return out



def _printable(value: str | None, param: str) -> str | None:
    """A name shown in listings and on the operator's terminal (``lmsp clients``):
    no control characters, which could drive that terminal."""
    if value is not None and any(unicodedata.category(ch) == "Cc" for ch in value):
        raise InvalidRequest(f"{param!r} must not contain control characters", param=param)
    return value

class PairingService:
    """Pairing codes and their redemption, without HTTP."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def create_code(self, body: dict) -> dict:
        reject_unknown(body, ("scopes", "name", "expires_in"))
        scopes = body.get("scopes")
        scopes = DEFAULT_PAIRING_SCOPES if scopes is None else auth.validate_scopes(scopes)
        name = _printable(get_str(body, "name", max_len=200), "name")
        ttl = self.deps.config.pairing_ttl_seconds
        expires_in = get_int(body, "expires_in", default=ttl, minimum=1, maximum=max(ttl, 86400))
        now = self.deps.clock()
        code = auth.new_pairing_code()
        expires_at = int(now) + expires_in
        row = self.deps.store.create_pairing(code_hash=auth.hash_code(code), scopes=scopes,
                                             expires_at=expires_at, name=name)
        out = {"object": "pairing", "code": code, "scopes": scopes, "name": name,
               "created_at": int(now), "expires_at": expires_at}
        if isinstance(row, dict) and row.get("id"):
            out["id"] = row["id"]
        return out

    def redeem(self, body: dict) -> dict:
        reject_unknown(body, ("code", "client_name"))
        code = get_str(body, "code", required=True, max_len=100)
        client_name = _printable(get_str(body, "client_name", required=True, max_len=200), "client_name")
        store, config = self.deps.store, self.deps.config
        token = auth.new_token()
        try:
            client = store.redeem_pairing(code_hash=auth.hash_code(code), client_name=client_name,
                                          token_hash=auth.hash_token(token),
                                          max_failures=config.pairing_max_attempts, window=FAILURE_WINDOW_SECONDS)
        except NotFound:
            log.warning("failed pairing attempt")
            raise InvalidRequest("the pairing code is unknown, already used or expired",
                                 param="code") from None
        log.info("client paired", extra={"client_id": client["id"]})
        return {"object": "client_token", "client_id": client["id"], "client_name": client["name"],
                "token": token, "scopes": list(client["scopes"])}


class PairingsResource:
    """``POST /v1/pairings`` (admin): a one-time pairing code."""

    scopes = {"POST": "admin"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.service = PairingService(deps)

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        idempotency.key_of(req)  # validated; codes are shown once and never recorded
        body = self.deps.body(req, optional=True) or {}
        set_json(resp, self.service.create_code(body), 201)


class PairResource:
    """``POST /v1/pair`` (no token): redeem a pairing code for a client token."""

    scopes = {"POST": None}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.service = PairingService(deps)

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        idempotency.key_of(req)  # validated; tokens are shown once and never recorded
        body = self.deps.body(req)
        set_json(resp, self.service.redeem(body), 201)


class ClientsResource:
    scopes = {"GET": "admin"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        rows = self.deps.store.list_clients()
        set_json(resp, {"object": "list", "data": [client_object(r) for r in rows]})


class ClientResource:
    scopes = {"GET": "admin", "DELETE": "admin"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def _find(self, client_id: str) -> dict:
        check_id(client_id, "cli", "client")
        for row in self.deps.store.list_clients():
            if row["id"] == client_id:
                return row
        raise NotFound(f"no client with id {client_id!r}")

    def on_get(self, req: falcon.Request, resp: falcon.Response, client_id: str) -> None:
        set_json(resp, client_object(self._find(client_id)))

    def on_delete(self, req: falcon.Request, resp: falcon.Response, client_id: str) -> None:
        check_id(client_id, "cli", "client")
        row = self.deps.store.revoke_client(client_id)
        log.info("client revoked", extra={"revoked_client_id": client_id,
                                          "by": caller(req)["id"]})
        set_json(resp, client_object(row))
