"""Idempotency keys (LMSP B.8) of every POST, as HTTP carries them: the
``Idempotency-Key`` header, the request's fingerprint (the sha256 of the client,
the method, the path and the canonical JSON of the body), and the header that
marks an answer replayed. The keys' rules are the service's
(:mod:`lmsp.service.keys`, :meth:`lmsp.service.tasks.TaskService.create`).
"""

from __future__ import annotations

from typing import Any, Callable

import falcon

from lmsp.errors import InvalidRequest
from lmsp.service.keys import Answer, KeyedActions, Keyed
from lmsp.store import fingerprint as store_fingerprint

from .common import set_json

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


def keyed(req: falcon.Request, client_id: str, body: dict[str, Any] | None) -> Keyed | None:
    """The request's key with its fingerprint; None without a key."""
    key = key_of(req)
    return None if key is None else Keyed(client_id, key, fingerprint(client_id, req.method, req.path, body))


def create_key(req: falcon.Request, client_id: str, body: dict[str, Any]) -> tuple[str, str] | None:
    """A create request's ``(key, fingerprint)``, which goes with its task."""
    found = keyed(req, client_id, body)
    return None if found is None else (found.key, found.fingerprint)


def replayed_header(replayed: bool) -> dict[str, str] | None:
    return {REPLAYED: "true"} if replayed else None


def answer(
    keys: KeyedActions,
    req: falcon.Request,
    resp: falcon.Response,
    client_id: str,
    body: dict[str, Any] | None,
    action: Callable[..., Answer],
    **options: Any,
) -> None:
    """Run the action under the request's key and write its JSON answer, marked when replayed."""
    status, out, replayed = keys.run(keyed(req, client_id, body), action, **options)
    set_json(resp, out, status, replayed_header(replayed))
