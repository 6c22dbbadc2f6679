"""Pairing and clients (LMSP B.2): ``/v1/pairings``, ``/v1/pair``, ``/v1/clients``.

Each resource parses (:mod:`lmsp.wire.pairing`, :mod:`lmsp.wire.clients`), makes one call to the account
service (:mod:`lmsp.service.accounts`) and writes the answer.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import falcon

from lmsp import auth
from lmsp.wire.clients import parse_update
from lmsp.wire.pairing import parse_pairing, parse_redeem

from . import idempotency
from .common import Deps, caller, check_id, dumps, set_json


def client_object(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k not in ("token_hash",)}
    out.setdefault("object", "client")
    return out


class PairingsResource:
    """``POST /v1/pairings`` (admin): a one-time pairing code."""

    scopes = {"POST": "admin"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        key = idempotency.key_of(req)
        body = self.deps.body(req, optional=True) or {}
        asked = parse_pairing(body, self.deps.config.pairing_ttl_seconds)
        accounts, client_id = self.deps.accounts, caller(req)["id"]
        if key is None:
            set_json(resp, accounts.create_code(asked), 201)
            return
        # under a key, the code is derived (from the key, a nonce kept with it and the
        # service's secret): a retry is answered with the same code, which the store
        # never holds (B.2: digests only)
        secret = accounts.secret()
        idempotency.answer(
            self.deps.keys,
            req,
            resp,
            client_id,
            body,
            lambda code: (201, accounts.create_code(asked, code)),
            ttl=accounts.key_ttl(),
            secret=(
                "code",
                lambda nonce: accounts.boxed_code(auth.derived_pairing_code(secret, client_id, key, nonce)),
            ),
        )


class PairResource:
    """``POST /v1/pair`` (no token): redeem a pairing code for a client token."""

    scopes = {"POST": None}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        key = idempotency.key_of(req)
        body = self.deps.body(req)
        asked = parse_redeem(body)
        accounts = self.deps.accounts
        if key is None:
            set_json(resp, accounts.redeem(asked), 201)
            return
        # no client yet: the key belongs to the code and the client name (a digest of both,
        # so that a retry with another name is one more failed attempt, never a 422 to learn
        # from), and the token is derived, so that a retry after a lost answer gets the same
        # token, which the store never holds
        code = auth.normalize_code(asked.code)
        scope = "pair:" + hashlib.sha256(f"{code}\0{asked.client_name}".encode("utf-8")).hexdigest()
        secret = accounts.secret()
        idempotency.answer(
            self.deps.keys,
            req,
            resp,
            scope,
            body,
            lambda token: (201, accounts.redeem(asked, token)),
            ttl=accounts.key_ttl(),
            secret=("token", lambda nonce: auth.derived_token(secret, scope, key, nonce)),
        )
        if resp.status_code == 201 and isinstance(resp.text, str):  # a replay: its fleet token again
            answer = json.loads(resp.text)
            signed = accounts.fleet_token(answer)
            if signed is not answer:
                resp.text = dumps(signed)


class ClientsResource:
    scopes = {"GET": "admin"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        rows = self.deps.accounts.clients()
        set_json(resp, {"object": "list", "data": [client_object(r) for r in rows]})


class ClientResource:
    scopes = {"GET": "admin", "PATCH": "admin", "DELETE": "admin"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, client_id: str) -> None:
        check_id(client_id, "cli", "client")
        set_json(resp, client_object(self.deps.accounts.client(client_id)))

    def on_patch(self, req: falcon.Request, resp: falcon.Response, client_id: str) -> None:
        check_id(client_id, "cli", "client")
        limits = parse_update(self.deps.body(req))
        set_json(resp, client_object(self.deps.accounts.set_limits(client_id, limits, by=caller(req)["id"])))

    def on_delete(self, req: falcon.Request, resp: falcon.Response, client_id: str) -> None:
        check_id(client_id, "cli", "client")
        set_json(resp, client_object(self.deps.accounts.revoke(client_id, by=caller(req)["id"])))
