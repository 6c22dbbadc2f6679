"""Embeddings through the real runtime on the demo model: each request a task of
the store, running while it computes (its lease renewed like any task's),
deleted once answered; a cancel meanwhile ends it cancelled; bad input makes no
task; a crash under it leaves it to recovery, which fails it (policy fail)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from lmsp.errors import ContextLengthExceeded, InvalidRequest, LMSPError
from lmsp.runtime import embeddings as embeddings_mod


@pytest.fixture
def during(monkeypatch):
    """Runs the functions appended to it while the engine computes a request's embeddings."""
    hooks: list = []
    real = embeddings_mod.offload

    def offload(fn, *args, **kwargs):
        if getattr(fn, "__name__", "") == "embed":
            for hook in hooks:
                hook()
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(embeddings_mod, "offload", offload)
    return hooks


def test_a_request_is_a_running_task_then_nothing(runtime, store, during):
    seen = []
    during.append(lambda: seen.append(store.list_tasks()["data"]))
    result = runtime.embed("tiny", ["hello world", [1, 2, 3]], client_id="cli_x")
    assert len(result["vectors"]) == 2 and result["prompt_tokens"] > 3
    assert np.allclose(np.linalg.norm(result["vectors"], axis=1), 1.0, atol=1e-5)
    [task] = seen[0]
    assert task["id"] == result["task_id"] and task["status"] == "running" and task["on_restart"] == "fail"
    assert task["response_id"].startswith("embd-")
    assert store.list_tasks()["data"] == []  # deleted once answered


def test_its_lease_is_renewed_while_it_computes(runtime, store, during, config):
    def outlive_the_lease():
        time.sleep(config.lease_seconds * 2.5)  # the commit thread renews it meanwhile
        report = store.recover(startup=False)  # another worker's look for dead ones
        assert report["failed"] == [], report

    during.append(outlive_the_lease)
    assert len(runtime.embed("tiny", ["hello"])["vectors"]) == 1


def test_a_cancel_while_it_computes_ends_it_cancelled(runtime, store, during):
    during.append(lambda: store.cancel(store.list_tasks()["data"][0]["id"]))
    with pytest.raises(LMSPError) as caught:
        runtime.embed("tiny", ["hello"])
    assert caught.value.code == "cancelled" and caught.value.status == 409
    assert store.list_tasks()["data"] == []


def test_bad_input_makes_no_task(runtime, store):
    with pytest.raises(InvalidRequest):
        runtime.embed("tiny", [[10**9]])
    with pytest.raises(ContextLengthExceeded):
        runtime.embed("tiny", [[1] * 5000])
    assert store.list_tasks()["data"] == []


def test_a_worker_that_dies_under_it_leaves_it_to_recovery(runtime, store, during):
    class Died(BaseException):
        pass

    def die():
        raise Died  # the request never ends the task: as if the process died here

    during.append(die)
    with pytest.raises(Died):
        runtime.embed("tiny", ["hello"])
    [task] = store.list_tasks()["data"]
    assert task["status"] == "running"
    runtime.stop(timeout=5.0)
    report = store.recover(startup=True)
    assert report["failed"] == [task["id"]]
    assert store.get_task(task["id"])["error"]["code"] == "server_restarted"
