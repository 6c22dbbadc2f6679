"""Idempotency keys (LMSP B.8): a retried request is answered as the first one
was, and never makes a second task.

A response request's key is decided in the transaction that creates its task
(:meth:`IdempotencyArea._replay`, :meth:`IdempotencyArea._remember_task_key`);
any other POST holds a ``processing`` row between :meth:`idempotency_begin` and
:meth:`idempotency_finish` (or :meth:`idempotency_abort`).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from typing import Any

from ..contracts import CreatedTask
from ..errors import IdempotencyKeyInUse, IdempotencyKeyReused
from . import states as st
from .base import TASK_SELECT, StoreBase, dumps

# what a retry with the idempotency key of a deleted response is answered (B.8: no second task)
DELETED_ANSWER = {
    "error": {"code": "not_found", "param": None, "message": "the response of this Idempotency-Key was deleted"}
}


def fingerprint(client_id: str | None, method: str, path: str, body: Any) -> str:
    """The request fingerprint of B.8: sha256 hex of the canonical JSON of the request."""
    canonical = json.dumps(
        [client_id, method.upper(), path, body], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def answer_keys(conn: sqlite3.Connection, task_id: str, final: dict | None) -> None:
    """The idempotency keys of a task about to be deleted keep, until they
    expire, what a retry is answered (B.8: never a second task): ``final``
    (the finished Response object), or else 404, the response deleted."""
    status, body = (200, final) if final is not None else (404, DELETED_ANSWER)
    conn.execute(
        "UPDATE idempotency_keys SET state = 'done', status = ?, body = ?, task_id = NULL WHERE task_id = ?",
        (status, dumps(body), task_id),
    )


class IdempotencyArea(StoreBase):
    """The ``idempotency_keys`` table."""

    #: seconds after which a generic request's 'processing' idempotency row counts as
    #: abandoned (its process died before idempotency_finish/abort) and may be taken over
    PROCESSING_TIMEOUT = 600.0

    def _replay(
        self, conn: sqlite3.Connection, client_id: str | None, idempotency: tuple[str, str], now: float
    ) -> CreatedTask | None:
        """What a response request with this ``(key, fingerprint)`` is answered again
        (``create_task``'s return value), or None: no live key, go ahead."""
        key, fp = idempotency
        row = conn.execute(
            "SELECT * FROM idempotency_keys WHERE client_id = ? AND key = ?", (client_id or "", key)
        ).fetchone()
        if row is None:
            return None
        if row["expires_at"] <= now:
            conn.execute("DELETE FROM idempotency_keys WHERE client_id = ? AND key = ?", (client_id or "", key))
            return None
        if row["fingerprint"] != fp:
            raise IdempotencyKeyReused("this Idempotency-Key was used with a different request")
        if row["state"] == "processing":
            raise IdempotencyKeyInUse("a request with this Idempotency-Key is still being processed")
        task = response = None
        if row["task_id"] is not None:
            trow = conn.execute(TASK_SELECT + " WHERE id = ?", (row["task_id"],)).fetchone()
            if trow is not None:
                task = dict(trow)
                response = self._render_response(conn, self._response_row(conn, task["response_id"]), task)
        if row["state"] == "done":
            return {
                "response": response,
                "task": None if task is None else self._task_object(conn, task),
                "replay": (row["status"], json.loads(row["body"])),
            }
        if task is None:  # its task is gone without its key row turned into an answer: still no second task
            return {"response": None, "task": None, "replay": (404, DELETED_ANSWER)}
        if task["status"] in st.UNFINISHED:
            raise IdempotencyKeyInUse("the request with this Idempotency-Key is still running")
        assert response is not None  # rendered with its task
        return {"response": response, "task": self._task_object(conn, task), "replay": (200, response)}

    def replay_of(self, client_id: str | None, idempotency: tuple[str, str]) -> CreatedTask | None:
        """What a response request with this ``(key, fingerprint)`` is answered again, or
        None (no live key): :meth:`_replay` on its own."""
        with self._db.write() as conn:
            return self._replay(conn, client_id, idempotency, self._clock())

    def idempotency_begin(
        self, client_id: str | None, key: str, fingerprint: str, *, ttl: float | None = None
    ) -> tuple[int, dict] | None:
        """For a generic POST: None = go ahead (a 'processing' row is now held), else ``(status, body)``.
        ``ttl``: seconds the key is kept, if not the service's ``idempotency_ttl``."""
        with self._db.write() as conn:
            now = self._clock()
            row = conn.execute(
                "SELECT * FROM idempotency_keys WHERE client_id = ? AND key = ?", (client_id or "", key)
            ).fetchone()
            if row is not None and row["expires_at"] > now:
                if row["fingerprint"] != fingerprint:
                    raise IdempotencyKeyReused("this Idempotency-Key was used with a different request")
                abandoned = row["created_at"] < now - self.PROCESSING_TIMEOUT  # its process died
                if row["state"] == "processing" and not abandoned:
                    raise IdempotencyKeyInUse("a request with this Idempotency-Key is still being processed")
                if row["state"] == "done":
                    return row["status"], json.loads(row["body"])
                if row["state"] == "task":
                    raise IdempotencyKeyInUse("this Idempotency-Key belongs to a response request")
            conn.execute(
                "INSERT OR REPLACE INTO idempotency_keys (client_id, key, fingerprint, state, created_at,"
                " expires_at) VALUES (?,?,?,'processing',?,?)",
                (client_id or "", key, fingerprint, now, now + (self.idempotency_ttl if ttl is None else float(ttl))),
            )
            return None

    def idempotency_finish(self, client_id: str | None, key: str, status: int, body: dict) -> None:
        with self._db.write() as conn:
            conn.execute(
                "UPDATE idempotency_keys SET state = 'done', status = ?, body = ? "
                "WHERE client_id = ? AND key = ? AND state = 'processing'",
                (int(status), dumps(body), client_id or "", key),
            )

    def idempotency_abort(self, client_id: str | None, key: str) -> None:
        with self._db.write() as conn:
            conn.execute(
                "DELETE FROM idempotency_keys WHERE client_id = ? AND key = ? AND state = 'processing'",
                (client_id or "", key),
            )

    def _remember_task_key(
        self,
        conn: sqlite3.Connection,
        client_id: str | None,
        idempotency: tuple[str, str],
        task_id: str,
        body: dict | None,
        now: float,
    ) -> None:
        """Keep the key of a response request that made ``task_id``: with ``body`` (a
        background request's 202 answer) as that answer, else as the task's key (a retry
        is answered from the task once it finished)."""
        key, fp = idempotency
        if body is not None:
            conn.execute(
                "INSERT INTO idempotency_keys (client_id, key, fingerprint, state, status, body,"
                " task_id, created_at, expires_at) VALUES (?,?,?,'done',202,?,?,?,?)",
                (client_id or "", key, fp, dumps(body), task_id, now, now + self.idempotency_ttl),
            )
        else:
            conn.execute(
                "INSERT INTO idempotency_keys (client_id, key, fingerprint, state, task_id,"
                " created_at, expires_at) VALUES (?,?,?,'task',?,?,?)",
                (client_id or "", key, fp, task_id, now, now + self.idempotency_ttl),
            )
