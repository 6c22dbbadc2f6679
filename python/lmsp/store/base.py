"""What every area of the store shares: the database, the clock, the id maker,
and the task log's primitives (a task's row, its events, its transitions).

Each area of :class:`lmsp.store.Store` is a class derived from
:class:`StoreBase` (see :mod:`lmsp.store.store`); the helpers here run inside a
transaction an area opened, on the connection it hands them.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Callable

from .. import calls
from lmsp.items import chat
from .. import objects as obj
from ..contracts import StepState
from ..errors import NotFound
from . import sharing
from . import states as st
from .chains import finished as chain_finished
from .turns import append_turn
from .db import Database

#: a task's ``item_open`` while its open output item is a function call (1: a message)
CALL_OPEN = 2
#: a task's ``item_open`` once its output is on the chat layer (:mod:`lmsp.items.chat`),
#: kept after its items end: its Response's items are made from its events
CHAT_OPEN = obj.CHAT_OPEN
#: the same, for a model that thinks (its Response echoes the ``reasoning`` asked)
CHAT_THINK = obj.CHAT_THINK

UNFINISHED_SQL = st.UNFINISHED_SQL
# a task a worker may claim: word for word the WHERE of the tasks_claimable
# partial index (schema.py), so that SQLite answers from that index
CLAIMABLE_SQL = sharing.CLAIMABLE_SQL
FINISHED_SQL = "('completed','failed','cancelled')"


def last_seq_sql(table: str) -> str:
    """A task's sequence counter: the number of its last event (0 before the first).

    task_events' primary key (task_id, seq) is the counter, read in one seek, so
    appending an event is the whole of advancing it: no task row has to follow
    each event, and two writers of one number collide on that key.
    """
    return f"coalesce((SELECT max(seq) FROM task_events e WHERE e.task_id = {table}.id), 0)"


# a task row as a dict of these, plus ``last_seq``
TASK_SELECT = (
    "SELECT id, response_id, client_id, model, status, on_restart, attempts, created_at, started_at,"
    " finished_at, error, owner, lease_expires, attempt_seq, item_open, pending_tokens, kv_path, "
    f"{last_seq_sql('tasks')} AS last_seq FROM tasks"
)


def _task_extras(conn: sqlite3.Connection, task: dict) -> dict[str, int]:
    """What a task shows only in some states: its place in the queue, its output so far."""
    return {**sharing.queue_places(conn, task), **sharing.output_so_far(conn, task)}


def dumps(value: Any) -> str:
    """The compact JSON the store keeps."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class StoreBase:
    """The state every area works on; see the module docstring."""

    def __init__(
        self, db: Database, *, clock: Callable[[], float], new_id: Callable[[str], str], idempotency_ttl: float
    ) -> None:
        self._db = db
        self._clock = clock
        self._new_id = new_id
        self.idempotency_ttl = float(idempotency_ttl)
        # task id -> the StepState this process last committed for it: only a hint,
        # checked inside every transaction that relies on it (lmsp.store.steps)
        self._step_cache: dict[str, StepState] = {}

    @staticmethod
    def _task(conn: sqlite3.Connection, task_id: str, client_id: str | None = None) -> dict:
        row = conn.execute(TASK_SELECT + " WHERE id = ?", (task_id,)).fetchone()
        if row is None or (client_id is not None and row["client_id"] != client_id):
            raise NotFound(f"no task {task_id}")
        return dict(row)

    @staticmethod
    def _response_row(conn: sqlite3.Connection, response_id: str, client_id: str | None = None) -> sqlite3.Row:
        row = conn.execute("SELECT * FROM responses WHERE id = ?", (response_id,)).fetchone()
        if row is None or (client_id is not None and row["client_id"] != client_id):
            raise NotFound(f"no response {response_id}")
        return row

    @staticmethod
    def _attempt_text(conn: sqlite3.Connection, task: dict) -> str:
        rows = conn.execute(
            "SELECT text FROM task_events WHERE task_id = ? AND seq > ? AND text IS NOT NULL ORDER BY seq",
            (task["id"], task["attempt_seq"]),
        ).fetchall()
        return "".join(r[0] for r in rows)

    @staticmethod
    def _attempt_logprobs(conn: sqlite3.Connection, task: dict, response: sqlite3.Row) -> list | None:
        """The log probabilities of the current attempt's output, in order; None when
        the request did not ask for them."""
        if not obj.wants_logprobs(json.loads(response["request"] or "{}")):
            return None
        rows = conn.execute(
            "SELECT data FROM task_events WHERE task_id = ? AND seq > ? AND type = ? AND data IS NOT NULL ORDER BY seq",
            (task["id"], task["attempt_seq"], obj.DELTA),
        ).fetchall()
        return [entry for r in rows for entry in json.loads(r[0]).get("logprobs", ())]

    @staticmethod
    def _attempt_events(conn: sqlite3.Connection, task: dict) -> list[tuple[str, str | None]]:
        """The ``(type, data)`` of the current attempt's events, in order."""
        return conn.execute(
            "SELECT type, data FROM task_events WHERE task_id = ? AND seq > ? ORDER BY seq",
            (task["id"], task["attempt_seq"]),
        ).fetchall()

    @staticmethod
    def _task_object(conn: sqlite3.Connection, task: dict) -> dict:
        """The Task object, with its place in the queue while it waits to start and its
        output tokens so far while it runs."""
        return {**obj.task_object(task), **_task_extras(conn, task)}

    def _render_response(self, conn: sqlite3.Connection, response: sqlite3.Row, task: dict) -> dict:
        if task["item_open"] in (CHAT_OPEN, CHAT_THINK):  # its items are made from its events
            out = obj.response_object(response, task, None)
            status = chat.ITEM_STATUS.get(out["status"], "in_progress")
            out["output"] = chat.fold(self._attempt_events(conn, task), status)
            out["task"].update(_task_extras(conn, task))
            return out
        if task["status"] in st.FINISHED and response["output_text"] is not None:
            text = response["output_text"]
        else:
            text = self._attempt_text(conn, task)
        out = obj.response_object(response, task, text, self._attempt_logprobs(conn, task, response))
        out["task"].update(_task_extras(conn, task))
        return out

    @staticmethod
    def _emit(conn: sqlite3.Connection, task: dict, etype: str, now: float, payload: dict) -> int:
        task["last_seq"] += 1
        conn.execute(
            "INSERT INTO task_events (task_id, seq, type, created_at, data) VALUES (?,?,?,?,?)",
            (task["id"], task["last_seq"], etype, now, dumps(payload)),
        )
        return task["last_seq"]

    def _emit_task(self, conn: sqlite3.Connection, task: dict, etype: str, now: float) -> None:
        task["last_seq"] += 1  # the Task object carries the number of the event that holds it
        payload = {"task": obj.task_object(task)}
        task["last_seq"] -= 1
        self._emit(conn, task, etype, now, payload)

    def _emit_response(
        self, conn: sqlite3.Connection, task: dict, etype: str, now: float, response: sqlite3.Row | None = None
    ) -> None:
        if response is None:
            response = self._response_row(conn, task["response_id"])
        task["last_seq"] += 1
        payload = {"response": self._render_response(conn, response, task)}
        task["last_seq"] -= 1  # a response.failed carries its error in response.error only (B.6)
        self._emit(conn, task, etype, now, payload)

    def _close_item(
        self,
        conn: sqlite3.Connection,
        task: dict,
        now: float,
        status: str,
        text: str,
        response: sqlite3.Row | None = None,
    ) -> None:
        """The three events that close the open output item with ``text`` as its content
        (a function call item: its two, :meth:`_close_call`)."""
        if response is None:
            response = self._response_row(conn, task["response_id"])
        if task["item_open"] == CALL_OPEN:
            self._close_call(conn, task, now, status, "", response)
            return
        if task["item_open"] in (CHAT_OPEN, CHAT_THINK):  # every item still open; the mark stays
            for index, item, body, logprobs in chat.open_items(self._attempt_events(conn, task)):
                for etype, payload in chat.closing_events(item, index, body, status, logprobs):
                    self._emit(conn, task, etype, now, payload)
            return
        base = {"item_id": response["item_id"], "output_index": 0, "content_index": 0}
        logprobs = self._attempt_logprobs(conn, task, response) or []
        self._emit(conn, task, "response.output_text.done", now, {**base, "text": text, "logprobs": logprobs})
        self._emit(conn, task, "response.content_part.done", now, {**base, "part": obj.output_part(text, logprobs)})
        self._emit(
            conn,
            task,
            "response.output_item.done",
            now,
            {"output_index": 0, "item": obj.output_item(response["item_id"], status, text, logprobs)},
        )
        task["item_open"] = 0

    def _close_call(
        self, conn: sqlite3.Connection, task: dict, now: float, status: str, tail: str, response: sqlite3.Row
    ) -> None:
        """The events that close the open function call item (the output's last call):
        ``function_call_arguments.done`` (which keeps the call's ``tail``, the closing
        text of the output) and ``output_item.done``."""
        made = calls.split_all(self._attempt_text(conn, task)) or [("", "")]
        index = len(made) - 1
        name, arguments = made[index]
        fc_id = calls.ids(response["item_id"], index)[0]
        task["last_seq"] += 1
        conn.execute(
            "INSERT INTO task_events (task_id, seq, type, created_at, text, data) VALUES (?,?,?,?,?,?)",
            (
                task["id"],
                task["last_seq"],
                "response.function_call_arguments.done",
                now,
                tail,
                dumps({"item_id": fc_id, "output_index": index, "arguments": arguments}),
            ),
        )
        item = calls.call_item(response["item_id"], name, arguments, status, index)
        self._emit(conn, task, "response.output_item.done", now, {"output_index": index, "item": item})
        task["item_open"] = 0

    @staticmethod
    def _save(conn: sqlite3.Connection, task: dict) -> None:
        conn.execute(
            "UPDATE tasks SET status=?, attempts=?, started_at=?, finished_at=?, error=?, owner=?,"
            " lease_expires=?, attempt_seq=?, item_open=?, pending_tokens=?, kv_path=? WHERE id=?",
            (
                task["status"],
                task["attempts"],
                task["started_at"],
                task["finished_at"],
                task["error"],
                task["owner"],
                task["lease_expires"],
                task["attempt_seq"],
                task["item_open"],
                task["pending_tokens"],
                task["kv_path"],
                task["id"],
            ),
        )

    @staticmethod
    def _move(task: dict, target: str) -> None:
        st.check(task["id"], task["status"], target)
        task["status"] = target

    def _finish(
        self, conn: sqlite3.Connection, task: dict, target: str, now: float, *, error: dict | None = None
    ) -> None:
        """Move to a finished state and release the claim (the caller writes the final
        event). An output item still open is closed first, ``incomplete``."""
        self._move(task, target)
        if task["item_open"]:
            self._close_item(conn, task, now, "incomplete", self._attempt_text(conn, task))
        task.update(
            finished_at=now,
            owner=None,
            lease_expires=None,
            pending_tokens="",
            kv_path=None,
            error=None if error is None else dumps(error),
        )
        chain_finished(conn, task["id"], now)
        # a response of a conversation appends its turn with its terminal event
        append_turn(
            conn, task, now, lambda: self._render_response(conn, self._response_row(conn, task["response_id"]), task)
        )
