"""The store's reads of tasks, responses and events: what the API shows and the
streams replay. Each is one deferred transaction that writes nothing (see
``Store.READS``)."""

from __future__ import annotations

import json
import sqlite3
from typing import Callable, Iterable

from .. import objects as obj
from ..errors import InvalidRequest, NotFound
from . import states as st
from .base import TASK_SELECT, StoreBase, last_seq_sql

RESPONSE_STATUSES = {
    "queued": "t.status = 'queued'",
    "in_progress": "t.status IN ('loading','running','cancelling')",
    "completed": "t.status = 'completed' AND r.incomplete_reason IS NULL",
    "incomplete": "t.status = 'completed' AND r.incomplete_reason IS NOT NULL",
    "failed": "t.status = 'failed'",
    "cancelled": "t.status = 'cancelled'",
}
_MAX_LIMIT = 100


def _limit(limit: int) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= _MAX_LIMIT:
        raise InvalidRequest(f"limit must be an integer from 1 to {_MAX_LIMIT}", param="limit")
    return limit


class ReadsArea(StoreBase):
    """Reads of tasks, responses and their events."""

    def get_response(self, response_id: str, client_id: str | None = None) -> dict:
        with self._db.read() as conn:
            response = self._response_row(conn, response_id, client_id)
            task = dict(conn.execute(TASK_SELECT + " WHERE response_id = ?", (response_id,)).fetchone())
            return self._render_response(conn, response, task)

    def get_request(self, response_id: str, client_id: str | None = None) -> dict:
        """The request of a response as its task keeps it (JSON, as the web layer checked it)."""
        with self._db.read() as conn:
            return dict(json.loads(self._response_row(conn, response_id, client_id)["request"]))

    @staticmethod
    def _page(conn: sqlite3.Connection, sql: str, args: list, limit: int, render: Callable[[str], dict]) -> dict:
        ids = [r[0] for r in conn.execute(sql + " LIMIT ?", args + [limit + 1])]
        data = [render(i) for i in ids[:limit]]
        return {
            "object": "list",
            "data": data,
            "has_more": len(ids) > limit,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }

    def list_responses(
        self,
        client_id: str | None = None,
        *,
        status: str | None = None,
        limit: int = 20,
        after: str | None = None,
        prefix: str = "resp_",
        model: str | None = None,
        oldest_first: bool = False,
        metadata: dict[str, str] | None = None,
    ) -> dict:
        """The responses whose id starts with ``prefix`` (``resp_``, or ``chatcmpl-`` for
        chat completions), newest first (or oldest first); ``after`` is the last id of
        the previous page; ``metadata``: only those whose metadata has each pair."""
        limit = _limit(limit)
        # a range of ids that the index on (client_id, id) serves
        where, args = ["r.id >= ? AND r.id < ?"], [prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)]
        if model is not None:
            where.append("r.model = ?")
            args.append(model)
        if client_id is not None:
            where.append("r.client_id = ?")
            args.append(client_id)
        for key, value in (metadata or {}).items():
            where.append("EXISTS (SELECT 1 FROM json_each(r.request, '$.metadata') m WHERE m.key = ? AND m.value = ?)")
            args += [key, value]
        if status is not None:
            if status not in RESPONSE_STATUSES:
                raise InvalidRequest(f"unknown status {status!r}", param="status")
            where.append(RESPONSE_STATUSES[status])
        if after is not None:
            where.append("r.id > ?" if oldest_first else "r.id < ?")
            args.append(str(after))
        sql = (
            "SELECT r.id FROM responses r JOIN tasks t ON t.response_id = r.id WHERE "
            + " AND ".join(where)
            + (" ORDER BY r.id ASC" if oldest_first else " ORDER BY r.id DESC")
        )
        with self._db.read() as conn:

            def render(rid: str) -> dict:
                task = dict(conn.execute(TASK_SELECT + " WHERE response_id = ?", (rid,)).fetchone())
                return self._render_response(conn, self._response_row(conn, rid), task)

            return self._page(conn, sql, args, limit, render)

    def get_task(self, task_id: str, client_id: str | None = None) -> dict:
        with self._db.read() as conn:
            return self._task_object(conn, self._task(conn, task_id, client_id))

    def list_tasks(
        self, client_id: str | None = None, *, status: str | None = None, limit: int = 20, after: str | None = None
    ) -> dict:
        limit = _limit(limit)
        where, args = ["1"], []
        if client_id is not None:
            where.append("client_id = ?")
            args.append(client_id)
        if status is not None:
            if status not in st.STATES:
                raise InvalidRequest(f"unknown status {status!r}", param="status")
            where.append("status = ?")
            args.append(status)
        # the queue in the order it starts (tasks_start_order), every other list newest first
        queue = status == st.QUEUED
        if after is not None:
            where.append(
                "(start_tag, created_at, id) > (SELECT start_tag, created_at, id FROM tasks WHERE id = ?)"
                if queue
                else "id < ?"
            )
            args.append(str(after))
        order = " ORDER BY start_tag, created_at, id" if queue else " ORDER BY id DESC"
        sql = "SELECT id FROM tasks WHERE " + " AND ".join(where) + order
        with self._db.read() as conn:
            return self._page(conn, sql, args, limit, lambda tid: self._task_object(conn, self._task(conn, tid)))

    def task_id_for_response(self, response_id: str, client_id: str | None = None) -> str:
        with self._db.read() as conn:
            self._response_row(conn, response_id, client_id)
            return conn.execute("SELECT id FROM tasks WHERE response_id = ?", (response_id,)).fetchone()[0]

    def events(self, task_id: str, *, after: int = 0, limit: int = 1000, client_id: str | None = None) -> dict:
        """The task's events with ``sequence_number > after``, oldest first."""
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise InvalidRequest("after must be a non-negative integer", param="after")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise InvalidRequest("limit must be a positive integer", param="limit")
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT t.client_id, r.item_id FROM tasks t JOIN responses r ON r.id = t.response_id WHERE t.id = ?",
                (task_id,),
            ).fetchone()
            if row is None or (client_id is not None and row[0] != client_id):
                raise NotFound(f"no task {task_id}")
            item_id = row[1]
            rows = conn.execute(
                "SELECT seq, type, created_at, text, data FROM task_events WHERE task_id = ? "
                "AND seq > ? ORDER BY seq LIMIT ?",
                (task_id, after, limit + 1),
            ).fetchall()
        return {
            "object": "list",
            "data": [obj.event_object(r, item_id) for r in rows[:limit]],
            "has_more": len(rows) > limit,
        }

    def last_sequence(self, task_id: str) -> int:
        with self._db.read() as conn:
            row = conn.execute(f"SELECT {last_seq_sql('tasks')} FROM tasks WHERE id = ?", (task_id,)).fetchone()
        if row is None:
            raise NotFound(f"no task {task_id}")
        return row[0]

    def last_sequences(self, task_ids: Iterable[str]) -> dict[str, int]:
        """The sequence counters of many tasks in one read snapshot, by task id;
        a task that does not exist (any more) is left out."""
        ids = list(dict.fromkeys(task_ids))
        out: dict[str, int] = {}
        with self._db.read() as conn:
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                marks = ",".join("?" * len(chunk))
                out.update(conn.execute(f"SELECT id, {last_seq_sql('tasks')} FROM tasks WHERE id IN ({marks})", chunk))
        return out

    def output_text(self, task_id: str) -> str:
        """The task's output: the concatenated deltas after its last ``task.requeued``."""
        with self._db.read() as conn:
            return self._attempt_text(conn, self._task(conn, task_id))

    def task_counts(self) -> dict[str, int]:
        """The tasks in the store by state, every state named (0 where there are none):
        one count over ``tasks_status``, for ``/metrics``."""
        counts = dict.fromkeys(st.STATES, 0)
        with self._db.read() as conn:
            for status, n in conn.execute("SELECT status, count(*) FROM tasks GROUP BY status"):
                counts[status] = n
        return counts
