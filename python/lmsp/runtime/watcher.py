"""The waits of the requests for a task's next events, and the watch thread.

A request waits for its task's next committed events with
:meth:`Watcher.wait_for_commit`. For a task this process runs, every commit of
its events is announced (:mod:`.waiters`), so an unchanged commit generation
proves nothing new was committed and the store need not be asked. A task run
elsewhere, by nobody yet, or claimed here but not decoding yet (which others may
still cancel) is left to the **watch thread**: it reads the sequence counters of
all such tasks in one query per round, instead of one per waiting request, and
wakes the waiters of those that passed their number (or are gone).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from ..errors import LMSPError
from ..store.db import no_wait
from ._threads import Wakeup, gevent_active
from .state import WorkerState

log = logging.getLogger("lmsp.runtime")

WATCH_SECONDS = 0.25  # rounds of the watch thread while the tasks it watches stand still
WATCH_BUSY_SECONDS = 0.02  # ... and while one of them moved in the last round


class Watcher:
    """The watch thread's room (see the module docstring)."""

    def __init__(self, state: WorkerState) -> None:
        self.state = state
        self.wake = Wakeup()
        # task id -> {waiter: the sequence number it waits to pass}, for tasks not run here (under the lock)
        self.watched: dict[str, dict[Any, int]] = {}
        self.watching = False  # the thread runs: waiters need not poll the store (set by the runtime's start)

    def run(self) -> None:
        """The thread's loop; at its end every waiter it watched is woken to ask the store itself."""
        state = self.state
        wait = WATCH_SECONDS
        try:
            while not state.stopping:
                self.wake.wait(wait)
                if state.stopping:
                    break
                try:
                    wait = WATCH_BUSY_SECONDS if self.round() else WATCH_SECONDS
                except Exception as exc:  # a busy store: the next round reads again
                    log.debug("watch round failed: %s", exc)
                    wait = WATCH_SECONDS
        finally:
            with state.lock:
                self.watching = False  # from now on each waiter asks the store itself
                waiting = list(self.watched)
            state.waiters.notify(waiting)  # ... starting now

    def round(self) -> bool:
        """One read of the watched tasks' counters; wake the waiters of those that
        passed a waiter's number (or are gone). True when one did."""
        with self.state.lock:
            if not self.watched:
                return False
            lowest = {task_id: min(group.values()) for task_id, group in self.watched.items() if group}
        last = self.state.store.last_sequences(lowest)
        moved = [task_id for task_id, after in lowest.items() if last.get(task_id, after + 1) > after]
        if moved:
            self.state.waiters.notify(moved)
        return bool(moved)

    def wait_for_commit(self, task_id: str, after_seq: int, timeout: float, since: int | None = None) -> None:
        """Return once the task has events after ``after_seq`` (or on timeout).

        ``since``: the commit generation read before the caller last read the
        events (see the module docstring); without the watch thread (the runtime
        not started) the store is asked here.
        """
        waiters = self.state.waiters
        waiter = waiters.register(task_id)
        watched = False
        try:
            run = self.state.runs.get(task_id)
            if run is not None and since is not None and waiters.generation != since:
                return
            # a task claimed here but not decoding yet (its model loading, say) can still
            # be moved by others: a cancel from another process ends it at once
            decoding_here = run is not None and run.seq is not None
            watched = not decoding_here and self._watch(task_id, waiter, after_seq)
            if not watched and not (decoding_here and since is not None) and self._passed(task_id, after_seq):
                return
            waiter.wait(timeout)
        finally:
            if watched:
                self._unwatch(task_id, waiter)
            waiters.unregister(task_id, waiter)

    def _watch(self, task_id: str, waiter: Any, after_seq: int) -> bool:
        """Leave the waiter to the watch thread; False when the thread does not run."""
        with self.state.lock:  # the thread's end clears the flag under it
            if not self.watching:
                return False
            self.watched.setdefault(task_id, {})[waiter] = after_seq
            return True

    def _unwatch(self, task_id: str, waiter: Any) -> None:
        with self.state.lock:
            group = self.watched.get(task_id)
            if group is not None:
                group.pop(waiter, None)
                if not group:
                    del self.watched[task_id]

    def _passed(self, task_id: str, after_seq: int) -> bool:
        """The store has an event of the task after ``after_seq``, or cannot say (an
        unknown task, a busy store: the caller re-reads and decides)."""
        try:
            # on the gevent hub a read must not wait out a lock (that would stop
            # every greenlet): a busy store returns at once, like an unknown task
            with no_wait() if gevent_active() else contextlib.nullcontext():
                return bool(self.state.store.last_sequence(task_id) > after_seq)
        except LMSPError:
            return True
