"""Retention without an operator (LMSP B.10): each worker's janitor thread."""
from __future__ import annotations

import time

import pytest
from runtime_helpers import submit, wait_finished

from lmsp.errors import NotFound


def test_the_janitor_deletes_what_retention_let_go_and_nothing_unfinished(store, make_runtime, model_file):
    rt = make_runtime(store)
    rt.register_model("tiny.gguf")
    done = wait_finished(rt, store, submit(store, rt, max_output_tokens=2))
    rt.stop()  # nothing claims the next task: it stays queued
    waiting = submit(store, None, max_output_tokens=2)
    real_clock = store._clock
    store._clock = lambda: real_clock() + 8 * 86400.0  # past the 7 days of retention
    assert rt.janitor.round()["tasks"] == 1
    with pytest.raises(NotFound):
        store.get_task(done["id"])
    assert store.get_task(waiting)["status"] == "queued"


def test_the_janitor_thread_runs_its_rounds(store, make_runtime, model_file, monkeypatch):
    rounds = []
    real_gc = store.gc
    store.gc = lambda **kwargs: rounds.append(kwargs) or real_gc(**kwargs)
    monkeypatch.setattr("lmsp.runtime.janitor.JANITOR_FIRST_SECONDS", 0.0)
    make_runtime(store)  # its janitor thread starts with it
    deadline = time.monotonic() + 60  # a guard against a hang only
    while not rounds:
        assert time.monotonic() < deadline, "the janitor never ran"
        time.sleep(0.05)
    assert rounds[0] == {"retention": 7 * 86400.0}  # B.10: 7 days unless configured
