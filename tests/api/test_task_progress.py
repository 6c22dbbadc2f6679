"""A running task's output tokens so far (``output_tokens``), for the console's queue and any
script: counted from what the steps committed, shown on the Task object, the task lists and
a Response's ``task``, and only while the task runs."""
from __future__ import annotations

import pytest
from api_fakes import OWNER


@pytest.fixture
def held(scripted):
    """The scripted worker runs nothing until a test says so."""
    scripted.auto = False
    return scripted


def background(api) -> dict:
    result = api.post("/v1/responses", json={"model": "tiny", "input": "Say hello", "background": True})
    assert result.status_code == 202, result.text
    return result.json


def step(store, task_id: str, delta: str, tokens: list[int], finish: str | None = None) -> None:
    usage = {"input_tokens": 3, "output_tokens": 6} if finish else None
    outcome = store.append_step(OWNER, [{"task_id": task_id, "delta": delta, "tokens": tokens, "finish": finish,
                                         "usage": usage}])
    assert outcome["skipped"] == []


def test_a_running_tasks_tokens_so_far_on_every_view_of_it(user, held, store):
    running = background(user)
    tid = running["task"]["id"]
    held.start_all()
    assert user.get(f"/v1/tasks/{tid}").json["output_tokens"] == 0  # started, nothing generated yet
    step(store, tid, "Hello", [7])
    step(store, tid, " there", [8, 9])  # a step of two tokens
    step(store, tid, "", [10])  # a token held back until text follows
    assert user.get(f"/v1/tasks/{tid}").json["output_tokens"] == 4
    step(store, tid, "!", [11])
    task = user.get(f"/v1/tasks/{tid}").json
    assert task["status"] == "running" and task["output_tokens"] == 5
    assert "queue_position" not in task
    listed = user.get("/v1/tasks", params={"status": "running"}).json["data"]
    assert [(t["id"], t["output_tokens"]) for t in listed] == [(tid, 5)]
    assert user.get(f"/v1/responses/{running['id']}").json["task"]["output_tokens"] == 5
    step(store, tid, " done", [12], finish="stop")
    done = user.get(f"/v1/tasks/{tid}").json
    assert done["status"] == "completed" and "output_tokens" not in done  # the response's usage has it now
    assert user.get(f"/v1/responses/{running['id']}").json["usage"]["output_tokens"] == 6


def test_a_queued_task_has_a_place_and_no_tokens(user, held):
    task = user.get(f"/v1/tasks/{background(user)['task']['id']}").json
    assert task["status"] == "queued" and task["queue_position"] == 1 and "output_tokens" not in task


def test_a_cancelling_task_keeps_its_count(user, held, store):
    tid = background(user)["task"]["id"]
    held.start_all()
    step(store, tid, "one", [1, 2, 3])
    assert user.post(f"/v1/tasks/{tid}/cancel").json["status"] == "cancelling"
    task = user.get(f"/v1/tasks/{tid}").json
    assert task["status"] == "cancelling" and task["output_tokens"] == 3


def test_the_running_and_the_queued_lists_together_make_the_queue(user, held, store):
    first, second, third = (background(user)["task"]["id"] for _ in range(3))
    claims = store.claim(OWNER, limit=1, lease=60)
    store.set_running(claims[0]["task_id"], OWNER)
    step(store, first, "a", [5])
    running = user.get("/v1/tasks", params={"status": "running"}).json["data"]
    queued = user.get("/v1/tasks", params={"status": "queued"}).json["data"]
    assert [(t["id"], t["output_tokens"]) for t in running] == [(first, 1)]
    assert [(t["id"], t["queue_position"]) for t in queued] == [(second, 1), (third, 2)]
