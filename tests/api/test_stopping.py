"""A worker that stops: new work gets 503, streams and waits end with a word, not a cut."""
from __future__ import annotations

import itertools
import threading

import pytest
from api_helpers import assert_error, parse_sse

from lmsp.api.events import SSE_FRAMES
from lmsp.service.streams import event_stream


@pytest.fixture
def held(scripted):
    """The scripted worker runs nothing until a test says so."""
    scripted.auto = False
    return scripted


def test_a_create_while_the_worker_drains_gets_503_and_stores_nothing(user, scripted, store):
    scripted.draining = True   # SIGTERM came: the runtime claims nothing more
    for body in ({"model": "tiny", "input": "Hi", "background": True},
                 {"model": "tiny", "input": "Hi", "stream": True},
                 {"model": "tiny", "input": "Hi"}):
        result = user.post("/v1/responses", json=body, headers={"Idempotency-Key": f"k-{len(body)}"})
        assert_error(result, 503, "unavailable")
        assert int(result.headers["Retry-After"]) >= 1
    assert user.get("/v1/tasks").json["data"] == []
    assert user.get("/v1/responses").json["data"] == []


def test_an_open_stream_ends_with_a_stopping_event_and_its_task_goes_on(user, held, store):
    created = user.post("/v1/responses", json={"model": "tiny", "input": "Hi", "background": True}).json
    tid = created["task"]["id"]
    held.start_all()
    held.step(tid, "Hel")
    abandoned = []
    frames = event_stream(store, held, tid, heartbeat=0.01, on_abandon=lambda: abandoned.append(tid),
                          framing=SSE_FRAMES)
    first = list(itertools.islice(frames, 3))
    held.streams_ending = True  # the grace period is over
    rest = list(itertools.islice(frames, 20))
    events = parse_sse(b"".join(first + rest).decode())
    last = events[-1]
    assert last.get("event") == "error" and "id" not in last, events
    assert last["data"]["code"] == "server_stopping", last
    assert f"sequence number {events[-2]['id']}" in last["data"]["message"]
    assert [e["data"]["type"] for e in events[:-1] if "data" in e][-1] == "response.output_text.delta"
    assert abandoned == []  # not a client gone: the task is not cancelled
    assert store.get_task(tid)["status"] == "running"


def test_a_plain_request_whose_task_outlives_the_stop_gets_503(user, held, store):
    held.streams_ending = True   # the grace period is over, and the task still waits
    answer = {}
    thread = threading.Thread(target=lambda: answer.update(
        result=user.post("/v1/responses", json={"model": "tiny", "input": "Hi"})), daemon=True)
    thread.start()
    thread.join(30)
    assert "result" in answer, "the plain request still waits for its task after the stop"
    error = assert_error(answer["result"], 503, "unavailable")
    assert "stopping" in error["message"]
    assert answer["result"].headers["Retry-After"]
    [task] = user.get("/v1/tasks").json["data"]
    assert task["status"] == "queued"   # kept for the next start


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "store": True}),
    ("/v1/completions", {"prompt": "Once upon a time"}),
])
def test_an_openai_stream_cut_by_the_stop_offers_no_resume(app, user, held, store, path, body):
    """A chat completion or completion has restart policy fail and chunks without event
    numbers: its server_stopping error asks for the request again, not for a resume."""
    import json

    import falcon.testing

    env = falcon.testing.create_environ(path, method="POST", body=json.dumps(
        {"model": "tiny", "stream": True, **body}).encode(), headers={
        "Authorization": f"Bearer {user.token}", "Content-Type": "application/json"})
    frames = iter(app(env, lambda status, headers, exc_info=None: None))
    listed = user.get("/v1/tasks")
    assert listed.status_code == 200, listed.text
    [task] = listed.json["data"]
    assert task["on_restart"] == "fail"
    held.start_all()
    held.step(task["id"], "Hel")
    first = list(itertools.islice(frames, 2))
    held.streams_ending = True  # the grace period is over
    rest = list(itertools.islice(frames, 20))
    chunks = [e["data"] for e in parse_sse(b"".join(first + rest).decode()) if "data" in e]
    error = chunks[-1]["error"]
    assert error["code"] == "server_stopping" and chunks[-1] != "[DONE]", chunks
    assert chunks[0]["id"] in error["message"] and "send the request again" in error["message"]
    for offer in ("resume the stream", "sequence number", "starting_after", "Last-Event-ID"):
        assert offer not in error["message"], error
    assert "text" in chunks[-2]["choices"][0] or "delta" in chunks[-2]["choices"][0]
    assert store.get_task(task["id"])["status"] == "running"  # not cancelled: it follows its policy


@pytest.mark.parametrize("path,body,advice", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}, "send the request again"),
    ("/v1/completions", {"prompt": "Hi"}, "send the request again"),
    ("/v1/responses", {"input": "Hi"}, "send the request again"),  # on_restart fail, the default
    ("/v1/responses", {"input": "Hi", "on_restart": "resume"}, "fetch it then"),
])
def test_a_plain_request_cut_by_the_stop_is_told_what_its_policy_allows(user, held, path, body, advice):
    held.streams_ending = True   # the grace period is over, and the task still waits
    answer = {}
    thread = threading.Thread(target=lambda: answer.update(
        result=user.post(path, json={"model": "tiny", **body})), daemon=True)
    thread.start()
    thread.join(30)
    error = assert_error(answer["result"], 503, "unavailable")
    assert advice in error["message"], error
