"""Delivered ``store: false`` responses deleted together (lmsp.service.forgetting):
the deletions that wait while one is written go in the next write, and each
caller returns once its own response is deleted."""
from __future__ import annotations

import threading
import time

import pytest

from lmsp.service.forgetting import Forgetter
from lmsp.errors import NotFound, Unavailable

WAIT = 10.0


class GatedStore:
    """A store whose first ``forget_responses`` waits until the test opens the gate."""

    def __init__(self) -> None:
        self.writes: list[list[str]] = []
        self.deleted: set[str] = set()
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.fail: BaseException | None = None

    def forget_responses(self, given):
        self.writes.append([rid for rid, _ in given])
        if len(self.writes) == 1:
            self.entered.set()
            assert self.gate.wait(WAIT)
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail
        self.deleted.update(rid for rid, _ in given)
        return [NotFound(f"no response {rid}") if rid.endswith("gone") else None for rid, _ in given]


def test_those_waiting_during_a_write_go_together_in_the_next():
    store = GatedStore()
    forgetter = Forgetter(store)
    results: dict[str, tuple] = {}

    def forget(rid):
        error = forgetter.forget(rid, "cli_a")
        results[rid] = (error, rid in store.deleted)  # back only once its own response is deleted

    first = threading.Thread(target=forget, args=("resp_1",))
    first.start()
    assert store.entered.wait(WAIT)
    later = [threading.Thread(target=forget, args=(rid,)) for rid in ("resp_2", "resp_3", "resp_gone")]
    for thread in later:
        thread.start()
    # the three wait for the first write; then one of them writes all three
    for _ in range(int(WAIT / 0.01)):
        if len(forgetter._queue) == 3:
            break
        time.sleep(0.01)
    store.gate.set()
    for thread in [first, *later]:
        thread.join(WAIT)
        assert not thread.is_alive()
    assert store.writes[0] == ["resp_1"]
    assert len(store.writes) == 2 and sorted(store.writes[1]) == ["resp_2", "resp_3", "resp_gone"]
    assert all(deleted for _, deleted in results.values())
    assert [results[rid][0] for rid in ("resp_1", "resp_2", "resp_3")] == [None, None, None]
    assert isinstance(results["resp_gone"][0], NotFound)


def test_a_refused_write_is_each_callers_error():
    store = GatedStore()
    store.gate.set()
    store.fail = Unavailable("the store is busy")
    error = Forgetter(store).forget("resp_1", None)
    assert isinstance(error, Unavailable) and store.deleted == set()


class Stopped(BaseException):
    pass


def test_a_caller_stopped_during_its_write_leaves_the_batch_to_the_next():
    store = GatedStore()
    store.gate.set()
    store.fail = Stopped()
    forgetter = Forgetter(store)
    with pytest.raises(Stopped):
        forgetter.forget("resp_1", None)
    assert forgetter.forget("resp_2", None) is None
    assert store.writes == [["resp_1"], ["resp_1", "resp_2"]] and store.deleted == {"resp_1", "resp_2"}
