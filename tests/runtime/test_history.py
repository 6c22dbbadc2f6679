"""The service's own history: each worker's janitor writes its row of a minute that ended."""
from __future__ import annotations

import time

from runtime_helpers import submit, wait_finished

from lmsp.runtime.history import HistoryWriter, difference


class ShiftedClock:
    """The wall clock, moved forward by hand (the store keeps the real one)."""

    def __init__(self) -> None:
        self.offset = 61.0 - time.time() % 60  # a second into a minute: none ends while a task runs

    def __call__(self) -> float:
        return time.time() + self.offset


def test_the_janitor_writes_a_row_with_the_minutes_figures(store, make_runtime, model_file):
    clock = ShiftedClock()
    rt = make_runtime(store, clock=clock)
    rt.register_model("tiny.gguf")
    task = wait_finished(rt, store, submit(store, rt, max_output_tokens=4))
    assert task["status"] == "completed"
    assert store.service_history(60) == []  # the minute has not ended
    clock.offset += 60.0
    rt.janitor.wake.set()
    deadline = time.monotonic() + 30  # a guard against a hang only
    while not (rows := store.service_history(60)):
        assert time.monotonic() < deadline, "the janitor wrote no row"
        time.sleep(0.02)
        rt.janitor.wake.set()
    [row] = rows
    assert row["minute"] == int(clock() // 60) - 1
    assert row["tokens"] == rt.metrics()["tokens_generated"] > 0
    assert (row["tasks_finished"], row["errors"], row["running"], row["queued"]) == (1, 0, 0, 0)
    assert sum(row["ttft"].values()) == 1  # the task's first token
    assert row["db_bytes"] > 0 and row["model_bytes"] == model_file.stat().st_size
    assert not rt.history.tick()  # once a minute


def test_the_counts_of_a_refused_write_go_to_the_next_one(store, make_runtime, model_file):
    clock = ShiftedClock()
    rt = make_runtime(store, start=False, clock=clock)
    rt.state.owner = "w1"
    writer = HistoryWriter(rt.state, clock)
    rt.state.stats.commit(0.001, 7)
    real = store.record_minute
    store.record_minute = lambda *a: (_ for _ in ()).throw(RuntimeError("busy"))
    clock.offset += 60.0
    try:
        writer.tick()
    except RuntimeError:
        pass
    store.record_minute = real
    assert writer.tick()
    [row] = store.service_history(60)
    assert row["tokens"] == 7 and row["ttft"] == {}


def test_a_minute_histogram_is_the_difference_of_two_snapshots():
    before = {"tokens": 5, "tasks_finished": 1, "errors": 0, "ttft_buckets": [1] * 11, "ttft_count": 1}
    now = {"tokens": 9, "tasks_finished": 3, "errors": 1, "ttft_buckets": [1, 1, 2, 3, 3, 3, 3, 3, 3, 3, 3],
           "ttft_count": 4}
    out = difference(now, before)
    assert (out["tokens"], out["tasks_finished"], out["errors"]) == (4, 2, 1)
    assert out["ttft"][:4] == [[10.0, 0], [25.0, 0], [50.0, 1], [100.0, 1]]
    assert out["ttft"][-1] == [None, 1]  # one over the last bound
    assert difference(before, before)["ttft"] is None
