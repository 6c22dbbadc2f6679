"""Server variants of the serving benchmark that change how the service commits.

Never for real use: each one drops some of what the service guarantees, so that
a run shows what that guarantee costs. ``bench/serve.py`` starts them as gunicorn
with the service's configuration and this module's app (gunicorn's APP argument
takes the place of the configuration's), with this directory on ``PYTHONPATH``::

    PYTHONPATH=bench python -m gunicorn -c python:lmsp.serving.gunicorn_conf "variants:get_app('memevents')"

``get_app(name)`` is the service's app (built as :func:`lmsp.app.get_app` builds
it) with the runtime's commit thread taken by the variant's
:class:`~lmsp.runtime.committer.Committer` subclass:

* ``noevents`` (:class:`DeferredDeltas`): a task's text is committed once, when
  it ends, instead of at every step; its streams get the whole text at the end.
  It bounds from above what writing the step events costs.
* ``memevents`` (:class:`EventsInMemory`): the events of a running task are made
  exactly as a commit makes them and handed to its streams from memory, but
  written only when the task ends (all of them, in one transaction). Streams get
  every event as they do from a commit, so a run shows what the transactions of
  the steps cost, and nothing else. A crash loses the unwritten events.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from typing import Any

from lmsp.contracts import EventRow, StepItem, StepState
from lmsp.runtime import Runtime
from lmsp.runtime.committer import Committer
from lmsp.runtime.state import WorkerState
from lmsp.store.steprows import EventInsert, step_rows


class DeferredDeltas(Committer):
    """Commit only the items that end their tasks (``noevents``)."""

    def commit(self) -> bool:
        items = [item for item in self.pending.values() if item["finish"]]
        if not items:
            self.pending_since, self.urgent = time.monotonic(), False  # a new window
            return True
        return self.write(items)


class EventsInMemory(Committer):
    """Hand the steps of running tasks to their streams without a transaction; write
    each task's steps with its end (``memevents``)."""

    def __init__(self, state: WorkerState, *args: Any, **kwargs: Any) -> None:
        super().__init__(state, *args, **kwargs)
        self.unwritten: dict[str, list[StepItem]] = {}  # per task, its steps not written yet
        self.unwritten_state: dict[str, StepState] = {}  # ... and where append_step would continue it

    def commit(self) -> bool:
        ending, written = self.hold(list(self.pending.values()))
        if not ending:
            return True
        if not self.write(ending, written):
            return False
        for item in ending:
            self.unwritten.pop(item["task_id"], None)
            self.unwritten_state.pop(item["task_id"], None)
        return True

    def hold(self, items: list[StepItem]) -> tuple[list[StepItem], list[StepItem]]:
        """Show the steps of running tasks to their streams; (the ending items, what to
        write now: each ending task's held steps, then its end)."""
        now = time.time()
        ending: list[StepItem] = []
        written: list[StepItem] = []
        shown = []
        for item in items:
            task_id = item["task_id"]
            if item["finish"]:
                ending.append(item)
                written += self.unwritten.get(task_id, [])
                written.append(item)
                continue
            self.show(item, now)
            del self.pending[task_id]
            shown.append(task_id)
        if not ending:
            self.urgent = False
        if shown:
            self.state.waiters.notify(shown)
        return ending, written

    def show(self, item: StepItem, now: float) -> None:
        """Make the step's events as a commit would and keep them for the streams."""
        task_id = item["task_id"]
        state = self.unwritten_state.get(task_id)
        if state is None:
            state = written_state(self.state.config.db_path, task_id)
        state, rows = step_events(self.state.owner, item, state, now)
        self.unwritten_state[task_id] = state
        self.unwritten.setdefault(task_id, []).append(item)
        if rows:
            # every unwritten row stays readable: a stream that slept through a step
            # has no store to read it from
            self.state.committed.setdefault(task_id, (state.item_id, []))[1].extend(rows)


def step_events(owner: str, item: StepItem, state: StepState, now: float) -> tuple[StepState, list[EventRow]]:
    """The events ``append_step`` would write for one item of a task in ``state``, as
    :meth:`lmsp.store.Store.events` reads them back, and the state it would leave
    (the store's own turn of items into rows, without the database).

    An item that ends its task is refused (ValueError): its last events depend on
    the task's row.
    """
    rows: list[EventInsert] = []
    new = step_rows(owner, [item], {item["task_id"]: state}, now, rows, [], [])[item["task_id"]]
    if new is None:  # only an item that ends its task leaves no state
        raise ValueError("an item that ends its task is written by append_step only")
    return new, [(seq, etype, created_at, text, data) for _, seq, etype, created_at, text, _, data in rows]


def with_committer(runtime: Runtime, kind: type[Committer]) -> Runtime:
    """``runtime`` (not started yet) with its commit thread's room taken by ``kind``."""
    runtime.committer = kind(runtime.state, runtime.models.close_deleted)
    runtime.committed_events = runtime.committer.committed_events
    return runtime


def written_state(db_path: Any, task_id: str) -> StepState:
    """Where a task's rows in the database file leave it: what its next step continues
    from (the store's own query, on a connection of this module's)."""
    with closing(sqlite3.connect(db_path)) as conn:
        row = conn.execute(
            "SELECT t.owner, (SELECT coalesce(max(seq), 0) FROM task_events e WHERE e.task_id = t.id),"
            " t.item_open, t.pending_tokens, t.kv_path, r.item_id"
            " FROM tasks t JOIN responses r ON r.id = t.response_id WHERE t.id = ?",
            (task_id,),
        ).fetchone()
    return StepState(*row)


VARIANTS: dict[str, type[Committer]] = {"noevents": DeferredDeltas, "memevents": EventsInMemory}


def get_app(name: str) -> Any:
    """The service's app, built as :func:`lmsp.app.get_app` builds it, with the variant's
    commit thread."""
    from lmsp import config as config_mod
    from lmsp.api.logs import configure_logging
    from lmsp.app import create_app
    from lmsp.serving.hubsafe import hub_safe
    from lmsp.runtime.startup import open_store

    config = config_mod.load()
    configure_logging(config.log_level)
    store = open_store(config)
    runtime = with_committer(Runtime(config, store), VARIANTS[name])
    runtime.start()
    return create_app(config, hub_safe(store), runtime)
