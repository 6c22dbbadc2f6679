"""The durable store: LMSP chapter 11 on SQLite.

One :class:`Store` per process wraps one database file. Every write is one
``BEGIN IMMEDIATE`` transaction (see :mod:`lmsp.store.db`), so several worker
processes and threads can share the file: claims, cancels, sequence numbers
and idempotency decisions are all made inside the transaction that writes them.
"""
from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Callable

from .. import ids as _ids
from .. import objects as obj
from ..errors import NotFound
from . import states as st
from .accounts import AccountsArea
from .base import dumps, last_seq_sql
from .db import Database, translate
from .idempotency import IdempotencyArea
from .models import ModelsArea
from .reads import ReadsArea
from .recovery import RecoveryArea
from .retention import RetentionArea
from .schema import migrate
from .tasks import TasksArea
from .worker import WorkerArea

FINISHES = (None, "stop", "length", "cancelled", "error")
_NO_ENTRY = (None,)
_DELTA = "response.output_text.delta"


class _StaleStep(Exception):
    """A cached task state no longer matches its row (internal: the step is redone)."""


class Store(AccountsArea, ModelsArea, ReadsArea, TasksArea, IdempotencyArea, WorkerArea, RecoveryArea, RetentionArea):
    """The service's state in one SQLite file (see the module docstring of :mod:`lmsp.store.db`
    for what each ``durability`` level risks)."""

    # Methods that only read (one deferred transaction, no write): lmsp.hubsafe
    # runs them on the gevent hub itself, failing fast on a lock, and only
    # sends them to its thread pool when a lock is met.
    READS = frozenset({"events", "last_sequence", "last_sequences", "get_task", "get_response",
                       "task_id_for_response", "client_by_token_hash", "get_model", "list_models",
                       "list_responses", "list_tasks", "output_text", "client_active"})

    # -- life cycle ------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike, *, durability: str = "full", busy_timeout: float = 5.0,
             clock: Callable[[], float] = time.time, new_id: Callable[[str], str] = _ids.new_id,
             idempotency_ttl: float = 24 * 3600.0) -> "Store":
        """Open (creating and migrating as needed) the database at ``path``.

        A database of a newer schema raises :class:`lmsp.store.StoreError`; a
        locked or unwritable one :class:`lmsp.errors.Unavailable`.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        db = Database(path, durability=durability, busy_timeout=busy_timeout)
        store = cls(db, clock=clock, new_id=new_id, idempotency_ttl=idempotency_ttl)
        try:
            conn = db._acquire()
            try:
                migrate(conn, path=str(path))
            except sqlite3.Error as exc:
                raise translate(exc) from exc
            finally:
                db._release(conn)
            store.identity()
        except BaseException:
            db.close()
            raise
        return store

    def close(self) -> None:
        """Close every idle connection; later calls raise RuntimeError. Safe to call twice."""
        self._db.close()

    @property
    def path(self) -> Path:
        return self._db.path

    @property
    def durability(self) -> str:
        return self._db.durability

    def wait_hint(self) -> int:
        """A counter of the write transactions committed by this process (for wake-ups)."""
        return self._db.commits

    def append_step(self, owner: str, items: list[dict], *, with_events: bool = False) -> dict:
        """Record one engine step for many tasks in ONE transaction.

        Returns ``{"skipped": [ids not owned or not running], "cancelled": [ids that
        ended cancelled], "finished": {id: final status}}``. With ``with_events``
        also ``"events": {id: (item_id, rows)}``: for each task still running
        after the step, the event rows this transaction wrote for it (all of
        them, in order, without gaps), as ``(seq, type, created_at, text,
        data)``, which is what :meth:`events` would read back; a worker hands
        them to its streams without reading them again. Built after the
        transaction, outside the write lock.

        An item may carry ``attempt``, the task's ``attempts`` in the claim its
        output belongs to: an item of an earlier claim (the task recovered from
        this owner, then claimed by it again) is skipped. Every recovery writes
        an event, so such an item never passes the fast path below.

        The items of tasks this process stepped (or created claimed) before,
        when they do not end them, read no task row and, while a task's row
        does not change, write only their events: they take the numbers after
        the last one this process wrote, so a change made by anyone else since
        (a cancel, a recovery, each with its event) collides on the events'
        key or misses the guard of the row's update: that transaction is
        rolled back and the whole step is redone in a new one from the rows
        as they are. The other items (a task new to this process, one that
        ends) go through their rows in the same transaction. Either way the
        step is written exactly once.
        """
        cache = self._step_cache
        now = self._clock()
        rest: list[dict] = []
        # the usual step (every item one more delta of an open item) in one pass
        fast = self._steady_rows(owner, items, cache, now)
        if fast is None:
            # the fast path's states before the step, taken once (other threads may update
            # the cache meanwhile): the tasks this process last wrote as ``owner`` whose
            # items do not finish them. The others (new to this process, ending) go
            # through their rows, in the same transaction.
            known: dict[str, tuple] = {}
            checked: set[str] = set()
            for item in items:
                tid = item["task_id"]
                finish = item.get("finish")
                if finish is not None:
                    if finish not in FINISHES:
                        raise ValueError(f"unknown finish {finish!r}")
                    checked.add(tid)
                elif tid not in checked and tid not in known:
                    state = cache.get(tid, _NO_ENTRY)
                    if state[0] == owner:
                        known[tid] = state
                    else:
                        checked.add(tid)
            for tid in checked:
                known.pop(tid, None)
            fast_items = [item for item in items if item["task_id"] in known]
            rest = [item for item in items if item["task_id"] not in known]
            # the rows follow from the states taken above alone: made before the write lock
            fast = self._fast_rows(owner, fast_items, known, now) if fast_items else None
        try:
            result = None
            if fast is not None:
                try:
                    with self._db.write() as conn:
                        result = self._step_fast(conn, *fast)
                        if rest:
                            result = self._merge_steps(result, self._step_checked(conn, owner, rest, now))
                except _StaleStep:  # rolled back; redone below from the rows
                    result = None
            if result is None:
                with self._db.write() as conn:
                    result = self._step_checked(conn, owner, items, self._clock())
        except BaseException:
            for item in items:
                cache.pop(item["task_id"], None)
            raise
        return self._stepped(result, cache, with_events)

    def _stepped(self, result: tuple, cache: dict, with_events: bool) -> dict:
        """A written step's outcome; the tasks' new states go to the cache."""
        states, outcome, rows = result
        if with_events:
            outcome["events"] = self._written(rows, states)
        if len(cache) > 100_000:  # entries of tasks that were taken away and never stepped again
            cache.clear()
        for tid, state in states.items():
            if state is None:
                cache.pop(tid, None)
            else:
                cache[tid] = state
        return outcome

    @staticmethod
    def _steady_rows(owner: str, items: list[dict], cache: dict, now: float) -> tuple | None:
        """The fast path's writes in one pass, when every item is one task's next text
        delta (the task last written by this process as ``owner``, its item open,
        no tokens held back, not finishing, no KV file, not twice in the step):
        ``(states, event rows, no row updates)``. None for any other step."""
        events: list[tuple] = []
        states: dict[str, tuple] = {}
        append = events.append
        for item in items:
            tid = item["task_id"]
            state = cache.get(tid)
            if (state is None or state[0] != owner or not state[2] or state[3] or tid in states
                    or item.get("finish") is not None or item.get("kv_path")):
                return None
            delta = item.get("delta")
            if not delta:
                return None
            tokens = item.get("tokens")
            if not tokens:
                toks = ""
            elif len(tokens) == 1:
                toks = str(int(tokens[0]))
            else:
                toks = ",".join(map(str, map(int, tokens)))
            seq = state[1] + 1
            append((tid, seq, _DELTA, now, delta, toks, None))
            states[tid] = (owner, seq, 1, "", state[4], state[5])
        return states, events, []

    def step_state(self, task_id: str) -> tuple:
        """The state :meth:`append_step` continues a task from: ``(owner, last_seq,
        item_open, pending_tokens, kv_path, item_id)``. For the serving benchmark's
        in-memory mode, which makes a task's events before it writes them."""
        with self._db.read() as conn:
            row = conn.execute(f"SELECT t.owner, {last_seq_sql('t')}, t.item_open, t.pending_tokens, t.kv_path,"
                               " r.item_id FROM tasks t JOIN responses r ON r.id = t.response_id WHERE t.id = ?",
                               (task_id,)).fetchone()
        if row is None:
            raise NotFound(f"no task {task_id}")
        return tuple(row)

    # an event row as events() reads it and append_step(with_events=True) hands it out
    EVENT_ROW = ("seq", "type", "created_at", "text", "data")

    @staticmethod
    def _written(rows: list[tuple], states: dict) -> dict[str, tuple]:
        """The event rows of the tasks left running, per task: ``(item_id, [(seq, type, created_at,
        text, data)])``. A finished task's rows are left out: its last events come from ``_end``."""
        out: dict[str, tuple] = {}
        for tid, seq, etype, created_at, text, _, data in rows:
            entry = out.get(tid)
            if entry is None:
                state = states.get(tid)
                if state is None:
                    continue
                entry = out[tid] = (state[5], [])
            entry[1].append((seq, etype, created_at, text, data))
        return out

    @staticmethod
    def _step_items(owner: str, items: list[dict], known: dict, now: float, events: list,
                    ends: list | None, skipped: list | None) -> dict:
        """Turn items into event rows; return the step states they leave.

        A step state is ``(owner, last_seq, item_open, pending_tokens, kv_path, item_id)``.
        ``known`` maps a task id to its state before the step; a task not in it is
        skipped; a finished one gets None in the result (its final events come later).
        ``ends`` and ``skipped`` may be None where no item finishes and every task is known.
        """
        states: dict[str, tuple | None] = {}
        for item in items:
            tid = item["task_id"]
            state = states[tid] if tid in states else known.get(tid)
            if state is None:
                skipped.append(tid)
                continue
            _, seq, item_open, pending, kv_path, item_id = state
            delta = item.get("delta")
            finish = item.get("finish")
            if not item_open and (delta or finish == "stop" or finish == "length"):
                events.append((tid, seq + 1, "response.output_item.added", now, None, None, dumps(
                    {"output_index": 0, "item": obj.output_item(item_id, "in_progress", None)})))
                events.append((tid, seq + 2, "response.content_part.added", now, None, None, dumps(
                    {"item_id": item_id, "output_index": 0, "content_index": 0, "part": obj.output_part("")})))
                seq += 2
                item_open = 1
            tokens = item.get("tokens")
            if not tokens:
                toks = ""
            elif len(tokens) == 1:  # the usual step: one token per task
                toks = str(int(tokens[0]))
            else:
                toks = ",".join(map(str, map(int, tokens)))
            if delta:
                seq += 1
                if pending:
                    toks = pending + "," + toks if toks else pending
                    pending = ""
                events.append((tid, seq, "response.output_text.delta", now, delta, toks, None))
            elif toks:
                pending = pending + "," + toks if pending else toks
            kv = item.get("kv_path")
            if kv:
                kv_path = kv
            if finish is not None:
                ends.append((tid, item, (owner, seq, item_open, pending, kv_path, item_id)))
                states[tid] = None
            else:
                states[tid] = (owner, seq, item_open, pending, kv_path, item_id)
        return states

    _EVENT_INSERT = ("INSERT INTO task_events (task_id, seq, type, created_at, text, tokens, data) "
                     "VALUES (?,?,?,?,?,?,?)")
    # The fast path's guard: a step writes a task's next events at the numbers that follow
    # the last one this process wrote, so an event of anyone else (a cancel, a recovery,
    # another worker) since then takes the first of those numbers, and the insert
    # fails on task_events' primary key. A task whose row changes without an event of
    # its own in this step (a token held back) has the same condition in its update.
    _STEP_UPDATE = ("UPDATE tasks SET item_open = ?, pending_tokens = ?, kv_path = ? WHERE id = ? AND owner = ? "
                    f"AND {last_seq_sql('tasks')} = ?")

    @classmethod
    def _fast_rows(cls, owner: str, items: list[dict], known: dict, now: float) -> tuple:
        """The fast step's writes: ``(states, event rows, guarded row updates)``."""
        events: list[tuple] = []
        states = cls._step_items(owner, items, known, now, events, None, None)
        steps = []  # tasks whose row changes: item_open, pending_tokens or kv_path
        for tid, new in states.items():
            old = known[tid]
            if new[2] != old[2] or new[3] != old[3] or new[4] != old[4]:
                steps.append((new[2], new[3], new[4], tid, owner, old[1]))
        return states, events, steps

    def _step_fast(self, conn: sqlite3.Connection, states: dict, events: list[tuple], steps: list[tuple]):
        # the updates first: their guard reads the counters before this step's events
        if steps and conn.executemany(self._STEP_UPDATE, steps).rowcount != len(steps):
            raise _StaleStep()
        try:
            conn.executemany(self._EVENT_INSERT, events)
        except sqlite3.IntegrityError:  # a number taken by another writer, or the task is gone
            raise _StaleStep() from None
        return states, {"skipped": [], "cancelled": [], "finished": {}}, events

    @staticmethod
    def _merge_steps(fast: tuple, checked: tuple) -> tuple:
        """One step's result from its fast part and its checked part (disjoint tasks)."""
        states, _, events = fast
        checked_states, outcome, checked_events = checked
        return {**states, **checked_states}, outcome, events + checked_events

    def _step_checked(self, conn: sqlite3.Connection, owner: str, items: list[dict], now: float):
        wanted = list(dict.fromkeys(item["task_id"] for item in items))
        rows: dict[str, tuple] = {}
        attempts: dict[str, int] = {}
        for i in range(0, len(wanted), 500):
            chunk = wanted[i:i + 500]
            for row in conn.execute(
                    f"SELECT t.id, t.status, t.owner, {last_seq_sql('t')}, t.item_open, t.pending_tokens, t.kv_path,"
                    " r.item_id, t.attempts FROM tasks t JOIN responses r ON r.id = t.response_id"
                    f" WHERE t.id IN ({','.join('?' * len(chunk))})", chunk):
                if row[2] == owner and row[1] in (st.RUNNING, st.CANCELLING):
                    rows[row[0]] = (owner, row[3], row[4], row[5], row[6], row[7])
                    attempts[row[0]] = row[8]
        events: list[tuple] = []
        ends: list[tuple] = []
        skipped: list[str] = []
        # an item of an earlier claim of the task (recovered, then claimed again by
        # this owner) is not this claim's: skipped like a task that is not ours
        stale = {item["task_id"] for item in items
                 if item.get("attempt") is not None and item["task_id"] in rows
                 and item["attempt"] != attempts[item["task_id"]]}
        if stale:
            items = [item for item in items if item["task_id"] not in stale]
            skipped.extend(stale)
        states = self._step_items(owner, items, rows, now, events, ends, skipped)
        conn.executemany(self._EVENT_INSERT, events)
        written = [(tid, s) for tid, s in states.items() if s is not None]
        written += [(tid, s) for tid, _, s in ends]
        conn.executemany("UPDATE tasks SET item_open = ?, pending_tokens = ?, kv_path = ? WHERE id = ?",
                         [(s[2], s[3], s[4], tid) for tid, s in written])
        finished: dict[str, str] = {}
        cancelled: list[str] = []
        for tid, item, _ in ends:
            final = self._end(conn, tid, item, now)
            finished[tid] = final
            if final == st.CANCELLED:
                cancelled.append(tid)
        for tid in wanted:
            states.setdefault(tid, None)  # not ours (any more): forget it
        return states, {"skipped": skipped, "cancelled": cancelled, "finished": finished}, events

    def _end(self, conn: sqlite3.Connection, task_id: str, item: dict, now: float) -> str:
        """The final transition of a task the engine finished; a cancel accepted before always wins."""
        task = self._task(conn, task_id)
        response = self._response_row(conn, task["response_id"])
        finish = item["finish"]
        if task["status"] == st.CANCELLING or finish == "cancelled":
            target, etype = st.CANCELLED, "response.cancelled"
        elif finish == "error":
            target, etype = st.FAILED, "response.failed"
        else:
            target = st.COMPLETED
            etype = "response.incomplete" if finish == "length" else "response.completed"
        text = self._attempt_text(conn, task)
        reason = "max_output_tokens" if target == st.COMPLETED and finish == "length" else None
        error = None
        if target == st.FAILED:
            error = item.get("error") or {"code": "server_error", "message": "generation failed"}
            error = {"code": str(error.get("code") or "server_error"), "message": str(error.get("message") or "")}
        if task["item_open"]:
            self._close_item(conn, task, now, "completed" if etype == "response.completed" else "incomplete",
                             text, response)
        usage = item.get("usage")
        conn.execute("UPDATE responses SET output_text = ?, usage = ?, incomplete_reason = ? WHERE id = ?",
                     (text, None if usage is None else dumps(usage), reason, response["id"]))
        self._finish(conn, task, target, now, error=error)
        self._emit_response(conn, task, etype, now)
        self._save(conn, task)
        return target
