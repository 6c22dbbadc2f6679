"""Pairing and clients (LMSP B.2): ``/v1/pairings``, ``/v1/pair``, ``/v1/clients``."""

from __future__ import annotations

import hashlib
import logging
import unicodedata
from typing import Any, TypeVar

import falcon

from lmsp import auth
from lmsp.errors import InvalidRequest, NotFound, Unavailable
from lmsp.wire.fields import get_int, get_str, reject_unknown

from . import idempotency
from .common import Deps, caller, check_id, set_json

log = logging.getLogger("lmsp.api")

DEFAULT_PAIRING_SCOPES = ["responses:write", "responses:read", "models:read"]
FAILURE_WINDOW_SECONDS = 60


def client_object(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k not in ("token_hash",)}
    out.setdefault("object", "client")
    return out


_Name = TypeVar("_Name", str, str | None)


def _printable(value: _Name, param: str) -> _Name:
    """A name shown in listings and on the operator's terminal (``lmsp clients``):
    no control characters, which could drive that terminal."""
    if value is not None and any(unicodedata.category(ch) == "Cc" for ch in value):
        raise InvalidRequest(f"{param!r} must not contain control characters", param=param)
    return value


class PairingService:
    """Pairing codes and their redemption, without HTTP."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def create_code(self, body: dict[str, Any], code: str | None = None) -> dict[str, Any]:
        """A new pairing code (``code``: the one derived from the request's key)."""
        reject_unknown(body, ("scopes", "name", "expires_in"))
        scopes = body.get("scopes")
        scopes = DEFAULT_PAIRING_SCOPES if scopes is None else auth.validate_scopes(scopes)
        name = _printable(get_str(body, "name", max_len=200), "name")
        ttl = self.deps.config.pairing_ttl_seconds
        expires_in = get_int(body, "expires_in", default=ttl, minimum=1, maximum=max(ttl, 86400))
        now = self.deps.clock()
        code = code or auth.new_pairing_code()
        expires_at = int(now) + expires_in
        row = self.deps.store.create_pairing(
            code_hash=auth.hash_code(code), scopes=scopes, expires_at=expires_at, name=name
        )
        out = {
            "object": "pairing",
            "code": code,
            "scopes": scopes,
            "name": name,
            "created_at": int(now),
            "expires_at": expires_at,
        }
        if isinstance(row, dict) and row.get("id"):
            out["id"] = row["id"]
        return out

    def redeem(self, body: dict[str, Any], token: str | None = None) -> dict[str, Any]:
        """A client for the body's code (``token``: the one derived from the request's key)."""
        code = self.code_of(body)
        client_name = _printable(get_str(body, "client_name", required=True, max_len=200), "client_name")
        store, config = self.deps.store, self.deps.config
        token = token or auth.new_token()
        try:
            client = store.redeem_pairing(
                code_hash=auth.hash_code(code),
                client_name=client_name,
                token_hash=auth.hash_token(token),
                max_failures=config.pairing_max_attempts,
                window=FAILURE_WINDOW_SECONDS,
            )
        except NotFound:
            log.warning("failed pairing attempt")
            raise InvalidRequest("the pairing code is unknown, already used or expired", param="code") from None
        log.info("client paired", extra={"client_id": client["id"]})
        return {
            "object": "client_token",
            "client_id": client["id"],
            "client_name": client["name"],
            "token": token,
            "scopes": list(client["scopes"]),
        }

    @staticmethod
    def code_of(body: dict[str, Any]) -> str:
        reject_unknown(body, ("code", "client_name"))
        code: str = get_str(body, "code", required=True, max_len=100)
        return code

    def secret(self) -> bytes:
        """The service's secret; 503 (and the reason in the log) when it cannot be read."""
        try:
            return auth.service_secret(self.deps.config.data_dir)
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
        config = self.deps.config
        return min(float(config.pairing_ttl_seconds), float(config.idempotency_ttl_hours) * 3600.0)


class PairingsResource:
    """``POST /v1/pairings`` (admin): a one-time pairing code."""

    scopes = {"POST": "admin"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.service = PairingService(deps)

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        key = idempotency.key_of(req)
        body = self.deps.body(req, optional=True) or {}
        client_id = caller(req)["id"]
        if key is None:
            set_json(resp, self.service.create_code(body), 201)
            return
        # under a key, the code is derived (from the key, a nonce kept with it and the
        # service's secret): a retry is answered with the same code, which the store
        # never holds (B.2: digests only)
        secret = self.service.secret()
        idempotency.answer(
            self.deps.keys,
            req,
            resp,
            client_id,
            body,
            lambda code: (201, self.service.create_code(body, code)),
            ttl=self.service.key_ttl(),
            secret=("code", lambda nonce: auth.derived_pairing_code(secret, client_id, key, nonce)),
        )


class PairResource:
    """``POST /v1/pair`` (no token): redeem a pairing code for a client token."""

    scopes = {"POST": None}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.service = PairingService(deps)

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        key = idempotency.key_of(req)
        body = self.deps.body(req)
        if key is None:
            set_json(resp, self.service.redeem(body), 201)
            return
        # no client yet: the key belongs to the code and the client name (a digest of both,
        # so that a retry with another name is one more failed attempt, never a 422 to learn
        # from), and the token is derived, so that a retry after a lost answer gets the same
        # token, which the store never holds
        code = auth.normalize_code(self.service.code_of(body))
        name = get_str(body, "client_name", required=True, max_len=200)
        scope = "pair:" + hashlib.sha256(f"{code}\0{name}".encode("utf-8")).hexdigest()
        secret = self.service.secret()
        idempotency.answer(
            self.deps.keys,
            req,
            resp,
            scope,
            body,
            lambda token: (201, self.service.redeem(body, token)),
            ttl=self.service.key_ttl(),
            secret=("token", lambda nonce: auth.derived_token(secret, scope, key, nonce)),
        )


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

    def _find(self, client_id: str) -> dict[str, Any]:
        check_id(client_id, "cli", "client")
        rows: list[dict[str, Any]] = self.deps.store.list_clients()
        for row in rows:
            if row["id"] == client_id:
                return row
        raise NotFound(f"no client with id {client_id!r}")

    def on_get(self, req: falcon.Request, resp: falcon.Response, client_id: str) -> None:
        set_json(resp, client_object(self._find(client_id)))

    def on_delete(self, req: falcon.Request, resp: falcon.Response, client_id: str) -> None:
        check_id(client_id, "cli", "client")
        row = self.deps.store.revoke_client(client_id)
        log.info("client revoked", extra={"revoked_client_id": client_id, "by": caller(req)["id"]})
        set_json(resp, client_object(row))
