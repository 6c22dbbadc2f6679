"""A store that cannot be written for a while (a full disk) fails no accepted task."""
from __future__ import annotations

import sqlite3
from contextlib import contextmanager

import pytest
from runtime_helpers import all_events, check_log, submit, wait_finished

from lmsp.runtime.scheduler import START_TRIES
from lmsp.store.db import translate


class FullDisk:
    """Every write of ``store`` fails as SQLite fails on a full disk, from the moment a
    task is claimed (by a claim, or by its creation when it starts early) until the
    writes that start (or fail) a claimed task have been refused ``starts`` times."""

    def __init__(self, store, starts: int) -> None:
        self.db = store._db
        self.real_write = self.db.write
        self.starts = starts
        self.full = False
        self.refused = 0            # writes refused
        self.refused_starts = 0     # ... of them, starting or failing a claimed task
        self.db.write = self._write
        claim = store.claim

        def claimed(*args, **kwargs):
            out = claim(*args, **kwargs)
            if out and not self.refused_starts:
                self.full = True
            return out

        store.claim = claimed
        create = store.create_task

        def created(*args, **kwargs):
            out = create(*args, **kwargs)  # a task created with its claim (started early) counts
            if isinstance(out, dict) and out.get("claim") and not self.refused_starts:
                self.full = True
            return out

        store.create_task = created
        for name in ("set_loading", "set_running", "fail_task"):
            setattr(store, name, self._starting(getattr(store, name)))

    def _starting(self, method):
        def call(*args, **kwargs):
            if self.full:
                self.refused_starts += 1
                if self.refused_starts >= self.starts:
                    self.full = False
                    raise translate(sqlite3.OperationalError("database or disk is full"))
            return method(*args, **kwargs)
        return call

    @contextmanager
    def _write(self):
        if self.full:
            self.refused += 1
            raise translate(sqlite3.OperationalError("database or disk is full"))
        with self.real_write() as conn:
            yield conn


@pytest.mark.slow  # about 11 s each: the store stays full for a while
@pytest.mark.parametrize("policy", ["fail", "retry", "resume"])
def test_a_task_that_cannot_start_on_a_full_store_starts_once_it_can_be_written(store, runtime, policy):
    disk = FullDisk(store, starts=START_TRIES + 3)
    task_id = submit(store, runtime, max_output_tokens=6, on_restart=policy)
    task = wait_finished(runtime, store, task_id)
    assert disk.refused_starts == START_TRIES + 3 and not disk.full
    assert task["status"] == "completed", task["error"]
    types = check_log(all_events(store, task_id))
    assert types.count("task.loading") == 1 and types.count("task.running") == 1
