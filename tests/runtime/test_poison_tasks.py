"""Poison tasks (LMSP B.12) on the real store and engine: each worker that runs the task
dies, the next recovers it through the expired lease and starts it again, and the start
past ``max_attempts`` fails it with ``attempts_exhausted`` instead."""
from __future__ import annotations

import logging

import pytest
from runtime_helpers import all_events, check_log, submit, wait_finished, wait_until

from lmsp.runtime import open_store, prepare


@pytest.mark.parametrize("policy", ["retry", "resume"])
def test_a_task_whose_workers_die_is_started_max_attempts_times(config, make_runtime, model_file, policy):
    cfg = config.replace(max_attempts=2)
    stores, runtimes = [], []

    def worker(start: bool):
        """Another worker process: its own connections; started once the one before dies
        (started earlier, its idle rounds could take the task first)."""
        store = open_store(cfg)
        stores.append(store)
        runtimes.append(make_runtime(store, config=cfg, start=start))
        return store, runtimes[-1]

    try:
        s1, w1 = worker(True)
        w1.register_model("tiny.gguf")
        tid = submit(s1, w1, "Count on:", on_restart=policy, max_output_tokens=1500)
        s2, w2 = worker(False)
        task = wait_until(w1, s1, tid, lambda t: t["last_sequence_number"] >= 10)
        w1.abort()  # dies: no commit, no release
        assert task["attempts"] == 1
        died_at = s1.get_task(tid)["last_sequence_number"]

        s3, w3 = worker(False)
        w2.start()  # the lease runs out (1 s): the task is recovered and started here again
        task = wait_until(w2, s2, tid, lambda t: t["status"] == "running" and t["last_sequence_number"] >= died_at + 8)
        assert task["attempts"] == 2 and tid in w2.state.runs
        types = check_log(all_events(s2, tid))
        assert types[died_at] == ("task.requeued" if policy == "retry" else "task.resumed")
        w2.abort()
        died_at = s2.get_task(tid)["last_sequence_number"]

        w3.start()  # the start past max_attempts: failed instead
        task = wait_finished(w3, s3, tid)
        assert (task["status"], task["attempts"], task["error"]["code"]) == ("failed", 2, "attempts_exhausted")
        assert "2 starts" in task["error"]["message"] and "max_attempts (2)" in task["error"]["message"]
        events = all_events(s3, tid)
        types = check_log(events)
        assert "task.running" not in types[died_at:] and types[-1] == "response.failed"
        assert events[-1]["response"]["error"]["code"] == "attempts_exhausted"
        assert tid not in w3.state.runs
        # the worker left runs the next task
        other = wait_finished(w3, s3, submit(s3, w3, "Hello", on_restart=policy, max_output_tokens=8))
        assert (other["status"], other["attempts"]) == ("completed", 1)
    finally:
        for runtime in runtimes:  # before their stores close
            runtime.stop(timeout=5.0)
        for store in stores:
            store.close()


def test_the_start_up_fails_a_task_out_of_starts_and_says_so(config, store, make_runtime, model_file, caplog):
    """The whole service killed while the task ran, with one start allowed: the next
    start fails it, whatever its policy, and the log names it."""
    cfg = config.replace(max_attempts=1)
    rt = make_runtime(store, config=cfg)
    rt.register_model("tiny.gguf")
    tid = submit(store, rt, "Count on:", on_restart="resume", max_output_tokens=1500)
    wait_until(rt, store, tid, lambda t: t["last_sequence_number"] >= 10)
    rt.abort()
    with caplog.at_level(logging.WARNING, logger="lmsp.runtime"):
        report = prepare(cfg, store)
    assert report["exhausted"] == report["failed"] == [tid] and report["resumed"] == []
    assert f"attempts_exhausted (their worker stopped in each of their 1 starts): {tid}" in caplog.text
    task = store.get_task(tid)
    assert (task["status"], task["attempts"], task["error"]["code"]) == ("failed", 1, "attempts_exhausted")
