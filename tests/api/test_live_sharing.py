"""Clients sharing the box, through the API over the REAL runtime and engine with
the tiny demo model: a client's backlog does not hold another's task back, and a
client at its limit is told to wait while another is not."""
from __future__ import annotations

import sqlite3
import time

import pytest
from api_helpers import Api, assert_error, live_service


BACKGROUND = {"model": "tiny", "input": "hi", "background": True, "max_output_tokens": 2}


@pytest.fixture(scope="module")
def live(tmp_path_factory, demo_model_path):
    """One started runtime with one engine slot, so that tasks start one by one."""
    with live_service(tmp_path_factory.mktemp("sharing"), demo_model_path, n_ctx=256, n_parallel=1,
                      max_output_tokens=2, max_output_tokens_cap=8) as service:
        yield service


def paired(live, name: str) -> tuple[str, Api]:
    """A client paired as an application pairs: a code from the admin, redeemed."""
    code = live["admin"].post("/v1/pairings", json={"name": name}).json["code"]
    token = Api(live["app"]).post("/v1/pair", json={"code": code, "client_name": name}).json
    return token["client_id"], Api(live["app"], token["token"])


def times(live, task_ids: list[str]) -> dict[str, tuple[float, float | None]]:
    """When each task was made and started, to the store's precision (the API's times are
    whole seconds)."""
    conn = sqlite3.connect(live["config"].db_path, timeout=10)
    try:
        marks = ",".join("?" * len(task_ids))
        rows = conn.execute(f"SELECT id, created_at, started_at FROM tasks WHERE id IN ({marks})", task_ids)
        return {tid: (made, began) for tid, made, began in rows}
    finally:
        conn.close()


def wait_for(check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_clients_backlog_does_not_hold_back_anothers_task(live):
    _, a = paired(live, "batch job")
    _, b = paired(live, "chat app")
    mine = [a.post("/v1/responses", json=BACKGROUND).json["task"]["id"] for _ in range(40)]
    created = b.post("/v1/responses", json=BACKGROUND)
    assert created.status_code == 202, created.text
    theirs = created.json["task"]["id"]
    wait_for(lambda: live["store"].get_task(theirs)["status"] == "completed")
    when = times(live, [*mine, theirs])
    made, began = when[theirs]
    assert began is not None
    # a's tasks that had not started when b's was made: b's starts before the fifth of them
    waiting = [when[t][1] for t in mine if when[t][1] is None or when[t][1] > made]
    assert len(waiting) >= 5, "a's tasks all started before b's was made: nothing to compare"
    assert sum(t is not None and t < began for t in waiting) < 4, (waiting, began)
    for task_id in mine:  # the rest of the backlog goes
        a.post(f"/v1/tasks/{task_id}/cancel")


def test_a_client_at_its_max_queued_is_refused_and_another_is_not(live):
    held_id, held = paired(live, "held back")
    _, other = paired(live, "other")
    admin = live["admin"]
    # nothing of it starts (max_running 0), so its tasks stay queued
    assert admin.patch(f"/v1/clients/{held_id}", json={"max_running": 0, "max_queued": 2}).status_code == 200
    queued = [held.post("/v1/responses", json=BACKGROUND) for _ in range(2)]
    assert [r.status_code for r in queued] == [202, 202]
    refused = held.post("/v1/responses", json=BACKGROUND)
    assert_error(refused, 429, "rate_limited")
    assert int(refused.headers["Retry-After"]) >= 1
    assert len(held.get("/v1/responses").json["data"]) == 2  # nothing stored for the refused one
    assert len(held.get("/v1/tasks", params={"status": "queued"}).json["data"]) == 2
    plain = other.post("/v1/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 2})
    assert plain.status_code == 200 and plain.json["status"] in ("completed", "incomplete")
    # the limits taken away, its queue moves again
    admin.patch(f"/v1/clients/{held_id}", json={"max_running": None, "max_queued": None})
    for answer in queued:
        task_id = answer.json["task"]["id"]
        wait_for(lambda task_id=task_id: live["store"].get_task(task_id)["status"] == "completed")
