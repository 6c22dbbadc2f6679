"""Idempotency keys (LMSP B.8) for every POST.

The fingerprint is the sha256 of the client, the method, the path and the
canonical JSON of the body. Creating a response passes key and fingerprint to
``store.create_task`` (key row and task in one transaction); other POSTs hold
the key with ``store.idempotency_begin`` while they run and record the answer
with ``idempotency_finish``. An error releases the key (``idempotency_abort``):
errors are not recorded, so a failed request can be retried with its key.
"""

from __future__ import annotations

import secrets
from typing import Any, Callable

import falcon

from lmsp.errors import InvalidRequest
from lmsp.store import fingerprint as store_fingerprint

Answer = tuple[int, dict[str, Any]]  # an action's status and JSON body

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"


def key_of(req: falcon.Request) -> str | None:
    value = req.get_header(HEADER)
    if value is None:
        return None
    if not 1 <= len(value) <= 255 or not all(32 <= ord(ch) < 127 for ch in value):
        raise InvalidRequest("Idempotency-Key must be 1 to 255 printable ASCII characters", param=HEADER)
    return value


def fingerprint(client_id: str | None, method: str, path: str, body: dict[str, Any] | None) -> str:
    """sha256 of the canonical JSON of client, method, path and body (the store's definition).
    A POST whose body is optional: no body and ``{}`` are the same request."""
    return store_fingerprint(client_id, method, path, {} if body is None else body)


# where a recorded answer keeps the nonce its secret field was derived with
_NONCE = "lmsp_nonce"


def run(
    store: Any,
    req: falcon.Request,
    client_id: str,
    body: dict[str, Any] | None,
    action: Callable[..., Answer],
    *,
    ttl: float | None = None,
    secret: tuple[str, Callable[[str], str]] | None = None,
) -> tuple[int, dict[str, Any], bool]:
    """Run ``action`` (returns status and body) under the request's key, if any;
    it takes no argument, or the secret's value when ``secret`` is given.

    ``secret``: ``(field, derive)`` for an answer with a field that is not
    recorded (a pairing code, a token: the store keeps digests only). The
    action is then called with the value ``derive(nonce)`` (``lmsp.auth``) for a
    new random nonce, which the key's row keeps in place of the value; a
    replay derives it again from there. ``ttl``: how long the key is kept, if
    not the service's setting. Returns ``(status, body, replayed)``.
    """
    key = key_of(req)
    if key is None:
        status, out = action() if secret is None else action(None)
        return status, out, False
    fp = fingerprint(client_id, req.method, req.path, body)
    replay = store.idempotency_begin(client_id, key, fp, ttl=ttl)
    if replay is not None:
        status, out = replay
        if secret is not None:
            kept_nonce = out.pop(_NONCE, None)
            if kept_nonce is not None:
                out[secret[0]] = secret[1](kept_nonce)
        return status, out, True
    nonce: str | None = None
    try:
        if secret is None:
            status, out = action()
        else:
            nonce = secrets.token_hex(16)
            status, out = action(secret[1](nonce))
    except BaseException:
        store.idempotency_abort(client_id, key)
        raise
    kept = out if secret is None else {**{k: v for k, v in out.items() if k != secret[0]}, _NONCE: nonce}
    store.idempotency_finish(client_id, key, status, kept)
    return status, out, False


def replayed_header(replayed: bool) -> dict[str, str] | None:
    return {REPLAYED: "true"} if replayed else None


def answer(
    store: Any,
    req: falcon.Request,
    resp: falcon.Response,
    client_id: str,
    body: dict[str, Any] | None,
    action: Callable[..., Answer],
    **options: Any,
) -> None:
    """:func:`run` the action and write its JSON answer, marked when replayed."""
    from .common import set_json

    status, out, replayed = run(store, req, client_id, body, action, **options)
    set_json(resp, out, status, replayed_header(replayed))
