"""The output of running tasks: ``append_step`` writes one engine step for many
tasks in one transaction, and ends the tasks it finishes.

A step takes one of two paths:

* **from the cached states** (:func:`~lmsp.store.steprows.usual_step`, else
  :func:`~lmsp.store.steprows.known_step`): the tasks this process stepped (or
  created claimed) before, when their items do not end them, read no task row;
  their rows are made before the write lock, from the :class:`StepState` this
  process last committed for each, and written under guards that catch any
  change made by anyone else since (:meth:`StepsArea._write_guarded`);
* **from the rows** (:meth:`StepsArea._write_from_rows`): the other items (a
  task new to this process, one that ends), in the same transaction; and the
  whole step again, in a new transaction, when a guard fails.
"""

from __future__ import annotations

import sqlite3
from typing import NamedTuple

from lmsp.items import chat
from ..contracts import EVENT_ROW_FIELDS, StepItem, StepOutcome, StepState
from . import sharing
from . import states as st
from .base import CALL_OPEN, CHAT_OPEN, CHAT_THINK, StoreBase, dumps, last_seq_sql
from .steprows import EventInsert, StepEnd, StepPlan, events_by_task, known_step, split_known, step_rows, usual_step

_EVENT_INSERT = "INSERT INTO task_events (task_id, seq, type, created_at, text, tokens, data) VALUES (?,?,?,?,?,?,?)"
# The guard of the path from the cached states: a step writes a task's next events at
# the numbers that follow the last one this process wrote, so an event of anyone else
# (a cancel, a recovery, another worker) since then takes the first of those numbers,
# and the insert fails on task_events' primary key. A task whose row changes without
# an event of its own in this step (a token held back) has the same condition in its update.
_GUARDED_UPDATE = (
    "UPDATE tasks SET item_open = ?, pending_tokens = ?, kv_path = ? WHERE id = ? AND owner = ? "
    f"AND {last_seq_sql('tasks')} = ?"
)
# a step reads the rows of this many tasks a query
_CHUNK = 500


class _StaleStep(Exception):
    """A cached task state no longer matches its row (internal: the step is redone)."""


class StepResult(NamedTuple):
    """A written step: the state each task is left in (None: forget it), the outcome,
    and the event rows written."""

    states: dict[str, StepState | None]
    outcome: StepOutcome
    events: list[EventInsert]

    def merge(self, other: StepResult) -> StepResult:
        """One step's result from two parts of it (disjoint tasks); ``other``'s outcome."""
        return StepResult({**self.states, **other.states}, other.outcome, self.events + other.events)


class StepsArea(StoreBase):
    """``append_step`` and the state it continues a task from."""

    #: the fields of an event row as :meth:`events` reads it and ``append_step(with_events=True)`` hands it out
    EVENT_ROW = EVENT_ROW_FIELDS

    def append_step(self, owner: str, items: list[StepItem], *, with_events: bool = False) -> StepOutcome:
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
        an event, so such an item never passes the path from the cached states.

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
        rest: list[StepItem] = []
        plan = usual_step(owner, items, cache, now)
        if plan is None:
            known, known_items, rest = split_known(owner, items, cache)
            # the rows follow from the states taken above alone: made before the write lock
            plan = known_step(owner, known_items, known, now) if known_items else None
        try:
            result = None if plan is None else self._write_plan(plan, owner, rest, now)
            if result is None:  # no task known, or a cached state gone stale: all through the rows
                with self._db.write() as conn:
                    result = self._write_from_rows(conn, owner, items, self._clock())
        except BaseException:
            for item in items:
                cache.pop(item["task_id"], None)
            raise
        return self._remember(result, with_events)

    def _write_plan(self, plan: StepPlan, owner: str, rest: list[StepItem], now: float) -> StepResult | None:
        """Write ``plan``, and ``rest`` through their rows, in one transaction; None (rolled
        back) when a cached state the plan was made from no longer matches its row."""
        try:
            with self._db.write() as conn:
                result = self._write_guarded(conn, plan)
                if rest:
                    result = result.merge(self._write_from_rows(conn, owner, rest, now))
                return result
        except _StaleStep:
            return None

    @staticmethod
    def _write_guarded(conn: sqlite3.Connection, plan: StepPlan) -> StepResult:
        # the updates first: their guard reads the counters before this step's events
        if plan.updates and conn.executemany(_GUARDED_UPDATE, plan.updates).rowcount != len(plan.updates):
            raise _StaleStep()
        try:
            conn.executemany(_EVENT_INSERT, plan.events)
        except sqlite3.IntegrityError:  # a number taken by another writer, or the task is gone
            raise _StaleStep() from None
        return StepResult(plan.states, {"skipped": [], "cancelled": [], "finished": {}}, plan.events)

    def _remember(self, result: StepResult, with_events: bool) -> StepOutcome:
        """A written step's outcome; the tasks' new states go to the cache."""
        cache = self._step_cache
        outcome = result.outcome
        if with_events:
            outcome["events"] = events_by_task(result.events, result.states)
        if len(cache) > 100_000:  # entries of tasks that were taken away and never stepped again
            cache.clear()
        for tid, state in result.states.items():
            if state is None:
                cache.pop(tid, None)
            else:
                cache[tid] = state
        return outcome

    @staticmethod
    def _running_states(
        conn: sqlite3.Connection, owner: str, task_ids: list[str]
    ) -> tuple[dict[str, StepState], dict[str, int]]:
        """The states of those of the tasks that ``owner`` holds and that run (or are
        being cancelled), read from their rows, with the ``attempts`` of each."""
        states: dict[str, StepState] = {}
        attempts: dict[str, int] = {}
        for i in range(0, len(task_ids), _CHUNK):
            chunk = task_ids[i : i + _CHUNK]
            for row in conn.execute(
                f"SELECT t.id, t.status, t.owner, {last_seq_sql('t')}, t.item_open, t.pending_tokens, t.kv_path,"
                " r.item_id, t.attempts FROM tasks t JOIN responses r ON r.id = t.response_id"
                f" WHERE t.id IN ({','.join('?' * len(chunk))})",
                chunk,
            ):
                if row[2] == owner and row[1] in (st.RUNNING, st.CANCELLING):
                    states[row[0]] = StepState(owner, row[3], row[4], row[5], row[6], row[7])
                    attempts[row[0]] = row[8]
        return states, attempts

    def _write_from_rows(self, conn: sqlite3.Connection, owner: str, items: list[StepItem], now: float) -> StepResult:
        """The general path: the items' tasks as their rows are, each ending task ended."""
        wanted = list(dict.fromkeys(item["task_id"] for item in items))
        known, attempts = self._running_states(conn, owner, wanted)
        events: list[EventInsert] = []
        ends: list[StepEnd] = []
        skipped: list[str] = []
        # an item of an earlier claim of the task (recovered, then claimed again by
        # this owner) is not this claim's: skipped like a task that is not ours
        stale = {
            item["task_id"]
            for item in items
            if item.get("attempt") is not None
            and item["task_id"] in known
            and item["attempt"] != attempts[item["task_id"]]
        }
        if stale:
            items = [item for item in items if item["task_id"] not in stale]
            skipped.extend(stale)
        states = step_rows(owner, items, known, now, events, ends, skipped)
        conn.executemany(_EVENT_INSERT, events)
        written = [(tid, s) for tid, s in states.items() if s is not None]
        written += [(end.task_id, end.state) for end in ends]
        conn.executemany(
            "UPDATE tasks SET item_open = ?, pending_tokens = ?, kv_path = ? WHERE id = ?",
            [(s.item_open, s.pending_tokens, s.kv_path, tid) for tid, s in written],
        )
        finished: dict[str, str] = {}
        cancelled: list[str] = []
        for end in ends:
            final = self._end_task(conn, end.task_id, end.item, now)
            finished[end.task_id] = final
            if final == st.CANCELLED:
                cancelled.append(end.task_id)
        for tid in wanted:
            states.setdefault(tid, None)  # not ours (any more): forget it
        return StepResult(states, {"skipped": skipped, "cancelled": cancelled, "finished": finished}, events)

    def _end_task(self, conn: sqlite3.Connection, task_id: str, item: StepItem, now: float) -> str:
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
        status = "completed" if etype == "response.completed" else "incomplete"
        if task["item_open"] == CALL_OPEN:  # its tail first: part of the output's text
            tail = "".join(segment.get("tail") or "" for segment in item.get("calls") or ())
            self._close_call(conn, task, now, status, tail, response)
        text = self._attempt_text(conn, task)
        reason = "max_output_tokens" if target == st.COMPLETED and finish == "length" else None
        error = None
        if target == st.FAILED:
            error = item.get("error") or {"code": "server_error", "message": "generation failed"}
            error = {"code": str(error.get("code") or "server_error"), "message": str(error.get("message") or "")}
        if task["item_open"]:
            self._close_item(conn, task, now, status, text, response)
        usage = item.get("usage")
        if usage is not None and task["item_open"] in (CHAT_OPEN, CHAT_THINK):
            usage = {**usage, "reasoning_tokens": self._reasoning_tokens(conn, task)}
        conn.execute(
            "UPDATE responses SET output_text = ?, usage = ?, incomplete_reason = ? WHERE id = ?",
            (text, None if usage is None else dumps(usage), reason, response["id"]),
        )
        if usage is not None:
            tokens = int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))
            sharing.record_usage(conn, task["client_id"], now, tokens)
        self._finish(conn, task, target, now, error=error)
        self._emit_response(conn, task, etype, now)
        self._save(conn, task)
        return target

    @staticmethod
    def _reasoning_tokens(conn: sqlite3.Connection, task: dict) -> int:
        """The tokens of the current attempt's reasoning: those its reasoning rows carry."""
        n = 0
        for (tokens,) in conn.execute(
            "SELECT tokens FROM task_events WHERE task_id = ? AND seq > ? AND type = ? AND tokens IS NOT NULL",
            (task["id"], task["attempt_seq"], chat.REASONING_DELTA),
        ):
            n += len(tokens.split(",")) if tokens else 0
        return n
