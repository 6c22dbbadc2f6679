"""Idempotency keys (LMSP B.8) of the requests that make no task: the action runs
once per key, and a request made again with the key gets the recorded answer.

A request holds its key while its action runs (``Store.idempotency_begin``) and
records the answer (``idempotency_finish``). An error releases the key
(``idempotency_abort``): errors are not recorded, so a failed request can be
sent again with its key. (A create request's key goes with its task, in the
task's own transaction: :meth:`lmsp.service.tasks.TaskService.create`.)
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from lmsp.store import Store

Answer = tuple[int, dict[str, Any]]  # an action's status and JSON body

# where a recorded answer keeps the nonce its secret field was derived with
_NONCE = "lmsp_nonce"


@dataclass(frozen=True)
class Keyed:
    """A request's key: whose, the key, and the request's fingerprint."""

    client_id: str
    key: str
    fingerprint: str


class KeyedActions:
    """Runs the actions of requests under their keys, over the store's key rows."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def run(
        self,
        keyed: Keyed | None,
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
        if keyed is None:
            status, out = action() if secret is None else action(None)
            return status, out, False
        client_id, key = keyed.client_id, keyed.key
        replay = self.store.idempotency_begin(client_id, key, keyed.fingerprint, ttl=ttl)
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
            self.store.idempotency_abort(client_id, key)
            raise
        kept = out if secret is None else {**{k: v for k, v in out.items() if k != secret[0]}, _NONCE: nonce}
        self.store.idempotency_finish(client_id, key, status, kept)
        return status, out, False
