"""B.6 and B.7 with the scripted worker holding tasks in the states the tests need."""
from __future__ import annotations

import json

import falcon.testing
import pytest
from openai._streaming import SSEDecoder
from api_helpers import assert_error, parse_sse

from lmsp.api.events import SSE_FRAMES, frame
from lmsp.service.streams import event_stream
from lmsp.errors import Unavailable


@pytest.fixture
def held(scripted):
    """The scripted worker runs nothing until a test says so."""
    scripted.auto = False
    return scripted


def background(api, **fields):
    body = {"model": "tiny", "input": "Say hello", "background": True}
    body.update(fields)
    result = api.post("/v1/responses", json=body)
    assert result.status_code == 202, result.text
    return result.json


def test_task_object_and_list(user, held):
    first = background(user)
    second = background(user)
    task = user.get(f"/v1/tasks/{first['task']['id']}").json
    assert task["object"] == "task" and task["response_id"] == first["id"]
    assert task["status"] == "queued" and task["attempts"] in (0, 1)
    assert task["last_sequence_number"] == 2
    page = user.get("/v1/tasks", params={"limit": "1"}).json
    assert page["has_more"] is True and page["data"][0]["id"] == second["task"]["id"]
    assert user.get("/v1/tasks", params={"status": "queued"}).json["data"][0]["status"] == "queued"
    assert user.get("/v1/tasks", params={"status": "running"}).json["data"] == []
    assert_error(user.get("/v1/tasks", params={"status": "in_progress"}), 400, "invalid_request",
                 "status")
    assert_error(user.get("/v1/tasks", params={"after": "resp_1"}), 400, "invalid_request", "after")
    assert_error(user.get("/v1/tasks/task_NOPE"), 404, "not_found")
    assert_error(user.get("/v1/tasks/nope"), 404, "not_found")


def test_events_json_page(user, held):
    body = background(user)
    tid = body["task"]["id"]
    held.start_all()
    held.finish(tid, "one two three")
    page = user.get(f"/v1/tasks/{tid}/events").json
    assert page["object"] == "list" and page["has_more"] is False
    seqs = [e["sequence_number"] for e in page["data"]]
    assert seqs == list(range(1, len(seqs) + 1))
    types = [e["type"] for e in page["data"]]
    assert types[:4] == ["response.created", "response.queued", "task.running", "response.in_progress"]
    assert types[-1] == "response.completed"
    after = user.get(f"/v1/tasks/{tid}/events", params={"after": "3", "limit": "2"}).json
    assert [e["sequence_number"] for e in after["data"]] == [4, 5] and after["has_more"] is True
    assert_error(user.get(f"/v1/tasks/{tid}/events", params={"after": "x"}), 400, "invalid_request",
                 "after")
    assert_error(user.get(f"/v1/tasks/{tid}/events", params={"limit": "1001"}), 400,
                 "invalid_request", "limit")


def test_events_sse_with_after_and_last_event_id(user, held):
    tid = background(user)["task"]["id"]
    held.start_all()
    held.finish(tid, "a b")
    sse = {"Accept": "text/event-stream"}
    full = parse_sse(user.get(f"/v1/tasks/{tid}/events", headers=sse).text)
    assert full[-1]["event"] == "response.completed"
    tail = parse_sse(user.get(f"/v1/tasks/{tid}/events", params={"after": "4"}, headers=sse).text)
    assert tail == full[4:]
    resumed = parse_sse(user.get(f"/v1/tasks/{tid}/events",
                                 headers={**sse, "Last-Event-ID": "6"}).text)
    assert resumed == full[6:]
    assert_error(user.get(f"/v1/tasks/{tid}/events", headers={**sse, "Last-Event-ID": "six"}), 400,
                 "invalid_request", "Last-Event-ID")


def test_cancel_queued_is_immediate(user, held, store):
    body = background(user)
    result = user.post(f"/v1/responses/{body['id']}/cancel")
    assert result.status_code == 200
    assert result.json["status"] == "cancelled" and result.json["task"]["status"] == "cancelled"
    events = store.events(body["task"]["id"])["data"]
    assert events[-1]["type"] == "response.cancelled"
    assert held.cancels == [body["task"]["id"]]
    # idempotent: cancelled stays cancelled with 200
    again = user.post(f"/v1/tasks/{body['task']['id']}/cancel")
    assert again.status_code == 200 and again.json["status"] == "cancelled"
    assert store.events(body["task"]["id"])["data"] == events


def test_cancel_running_goes_through_cancelling(user, held, store):
    body = background(user)
    tid = body["task"]["id"]
    held.start_all()
    held.step(tid, "partial ")
    result = user.post(f"/v1/tasks/{tid}/cancel", json={})
    assert result.status_code == 200 and result.json["status"] == "cancelling"
    assert store.events(tid)["data"][-1]["type"] == "task.cancelling"
    again = user.post(f"/v1/responses/{body['id']}/cancel")
    assert again.status_code == 200 and again.json["task"]["status"] == "cancelling"
    held.step(tid, "more", finish="stop")  # the engine's last step: the cancel wins
    final = user.get(f"/v1/responses/{body['id']}").json
    assert final["status"] == "cancelled"
    assert store.events(tid)["data"][-1]["type"] == "response.cancelled"


def test_cancel_finished_is_409(user, store):
    body = user.post("/v1/responses", json={"model": "tiny", "input": "x"}).json
    before = store.events(body["task"]["id"])["data"]
    assert_error(user.post(f"/v1/responses/{body['id']}/cancel"), 409, "task_finished")
    assert_error(user.post(f"/v1/tasks/{body['task']['id']}/cancel"), 409, "task_finished")
    assert store.events(body["task"]["id"])["data"] == before


def test_cancel_unknown_and_bad_body(user, held):
    assert_error(user.post("/v1/responses/resp_NOPE/cancel"), 404, "not_found")
    assert_error(user.post("/v1/tasks/bogus/cancel"), 404, "not_found")
    body = background(user)
    assert_error(user.post(f"/v1/responses/{body['id']}/cancel", json={"force": True}), 400,
                 "invalid_request", "force")


def _wsgi_stream(app, token, body, path="/v1/responses", method="POST", headers=None):
    """Call the app as a WSGI server would, returning the status and the body iterable."""
    seen = {}

    def start_response(status, response_headers, exc_info=None):
        seen["status"] = status
        seen["headers"] = {k.lower(): v for k, v in response_headers}

    path, _, query = path.partition("?")
    env = falcon.testing.create_environ(
        path=path, query_string=query, method=method, body=json.dumps(body) if body is not None else "",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                 **(headers or {})})
    return seen, app(env, start_response)


def test_stream_client_gone_cancels_the_task(app, user, held, store):
    seen, frames = _wsgi_stream(app, user.token, {"model": "tiny", "input": "hi", "stream": True})
    it = iter(frames)
    first = next(it)
    assert seen["status"].startswith("200")
    assert b"event: response.created" in first
    tid = json.loads(first.split(b"data: ", 1)[1])["response"]["task"]["id"]
    next(it)  # response.queued
    frames.close()  # the client went away
    assert store.get_task(tid)["status"] == "cancelled"


def test_background_stream_runs_on_when_the_client_goes_away(app, user, held, store):
    body = {"model": "tiny", "input": "hi", "stream": True, "background": True}
    seen, frames = _wsgi_stream(app, user.token, body)
    it = iter(frames)
    first = next(it)
    tid = json.loads(first.split(b"data: ", 1)[1])["response"]["task"]["id"]
    frames.close()
    assert store.get_task(tid)["status"] == "queued"
    assert seen["headers"]["location"].startswith("/v1/responses/resp_")


def test_idle_stream_sends_keep_alive_comments(app, user, held, store):
    tid = background(user)["task"]["id"]
    seen, frames = _wsgi_stream(app, user.token, None, path=f"/v1/tasks/{tid}/events",
                                method="GET", headers={"Accept": "text/event-stream"})
    it = iter(frames)
    assert next(it).startswith(b"id: 1\n")
    assert next(it).startswith(b"id: 2\n")
    assert next(it) == b": keep-alive\n"  # heartbeat_seconds is 0.05 in these tests
    held.start_all()
    rest = b""
    while b"event: task.running" not in rest:
        rest += next(it)
    frames.close()  # a reader going away cancels nothing
    assert store.get_task(tid)["status"] == "running"
    # the openai package's decoder, which keeps the last event id, sees events only
    decoder = SSEDecoder()
    text = b"id: 2\nevent: response.queued\ndata: {}\n\n" + rest
    seen_events = [sse for line in text.decode().splitlines() if (sse := decoder.decode(line)) is not None]
    assert seen_events and all(sse.data for sse in seen_events)
    assert seen_events[-1].event == "task.running"


def test_stream_follows_live_events_to_the_end(app, user, held, store):
    tid = background(user)["task"]["id"]
    seen, frames = _wsgi_stream(app, user.token, None, path=f"/v1/tasks/{tid}/events",
                                method="GET", headers={"Accept": "text/event-stream"})
    got = []
    for chunk in frames:
        if chunk.startswith(b":"):
            if not got or len(got) == 2:
                held.start_all()
                held.finish(tid, "live words")
            continue
        got.append(chunk)
    assert got[-1].startswith(b"id: ") and b"event: response.completed" in got[-1]
    assert [int(c.split(b"\n")[0][4:]) for c in got] == list(range(1, len(got) + 1))


def test_stream_ends_after_a_cancel(app, user, held, store):
    body = background(user)
    seen, frames = _wsgi_stream(app, user.token, None, path=f"/v1/responses/{body['id']}?stream=true",
                                method="GET")
    it = iter(frames)
    next(it), next(it)
    user.post(f"/v1/responses/{body['id']}/cancel")
    assert b"response.cancelled" in next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_stream_waits_out_a_busy_store(user, held, store):
    tid = background(user)["task"]["id"]

    class Busy:
        """The store, unavailable for its first two event reads."""

        def __init__(self) -> None:
            self.failures = 2

        def events(self, *args, **kwargs):
            if self.failures:
                self.failures -= 1
                raise Unavailable("database is locked")
            return store.events(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(store, name)

    busy = Busy()
    frames = event_stream(busy, held, tid, heartbeat=10.0, poll=0.001, framing=SSE_FRAMES)
    first, second = next(frames), next(frames)
    frames.close()
    assert busy.failures == 0
    assert first.startswith(b"id: 1\n") and second.startswith(b"id: 2\n")


def test_a_busy_store_at_the_end_of_the_data_is_waited_out_too(user, held, store):
    """The check whether the task has ended, made when no event is left to read, meets a
    busy store: the stream reads again (it used to end with an error event)."""
    tid = background(user)["task"]["id"]

    class Busy:
        failures = 1

        def get_task(self, *args, **kwargs):
            if self.failures:
                self.failures -= 1
                store.cancel(tid)  # meanwhile the task ends
                raise Unavailable("database is locked")
            return store.get_task(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(store, name)

    frames = list(event_stream(Busy(), held, tid, heartbeat=10.0, poll=0.001, framing=SSE_FRAMES))
    assert b"event: error" not in b"".join(frames)
    assert b"response.cancelled" in frames[-1]


def test_a_stream_takes_this_workers_latest_commit_from_memory(user, held, store):
    """Events of the runtime's latest commit reach a stream without a read; anything
    the commit did not write (another process's event, a gap) is read from the store."""
    from types import SimpleNamespace

    from lmsp.runtime.committer import Committer

    tid = background(user)["task"]["id"]
    held.start_all()

    class Committing:
        """The scripted worker, keeping its commits' rows as the runtime does."""

        def __init__(self) -> None:
            self.state = SimpleNamespace(committed={})
            self.store = store

        def step(self, delta: str, finish: str | None = None) -> None:
            outcome = store.append_step("scripted-worker", [{"task_id": tid, "delta": delta, "tokens": [1],
                                                             "finish": finish}], with_events=True)
            self.state.committed.update(outcome["events"])
            if finish:
                self.state.committed.pop(tid, None)

        committed_events = Committer.committed_events

        def __getattr__(self, name):
            return getattr(held, name)

    class Counting:
        def __init__(self) -> None:
            self.reads = 0

        def events(self, *args, **kwargs):
            self.reads += 1
            return store.events(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(store, name)

    worker, counting = Committing(), Counting()
    worker.step("Hello")  # before the stream opens: its first page is a read in any case
    frames = event_stream(counting, worker, tid, heartbeat=10.0, poll=0.001, framing=SSE_FRAMES)
    log = [next(frames) for _ in range(store.last_sequence(tid))]
    assert counting.reads == 1
    for word in (" from", " memory"):
        worker.step(word)
        log.append(next(frames))
        assert counting.reads == 1, "a committed delta of this worker is not read back"
    # an event this worker's commit did not write: the next commit no longer covers the gap
    held.store.cancel(tid)
    worker.step(" again")
    log += [next(frames), next(frames)]
    assert counting.reads == 2
    worker.step("", finish="stop")
    log += list(frames)
    assert counting.reads >= 3  # the end's events come from the store
    assert log == [frame(e) for e in store.events(tid)["data"]]
    assert b"response.cancelled" in log[-1]
