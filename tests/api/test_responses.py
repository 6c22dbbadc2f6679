"""B.5 with the scripted worker: the three ways to create, retrieve, list, delete,
validation of every field, isolation between clients."""
from __future__ import annotations

import json
import time

import falcon.testing
import pytest
from api_helpers import assert_error, parse_sse

from lmsp.wire.responses import parse_create

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}


def create(api, **fields):
    body = {"model": "tiny", "input": "Say hello"}
    body.update(fields)
    return api.post("/v1/responses", json=body)


def test_plain_returns_the_finished_response(user, store):
    result = create(user, metadata={"k": "v"}, temperature=0.5, top_p=0.9, max_output_tokens=8)
    assert result.status_code == 200, result.text
    body = result.json
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["status"] == "completed" and body["background"] is False
    assert body["output"][0]["content"][0]["text"] == "Hello from the scripted worker"
    assert body["metadata"] == {"k": "v"} and body["temperature"] == 0.5 and body["top_p"] == 0.9
    assert body["max_output_tokens"] == 8
    assert body["seed"] == 1234  # chosen by the service (the test's seed source) and stored
    assert body["task"]["status"] == "completed"
    assert user.get(f"/v1/responses/{body['id']}").json == body


def test_background_is_committed_then_202(user, scripted, store):
    scripted.auto = False
    result = create(user, background=True, on_restart="resume", seed=7)
    assert result.status_code == 202, result.text
    body = result.json
    assert body["status"] == "queued" and body["background"] is True and body["seed"] == 7
    assert body["task"]["on_restart"] == "resume"
    assert result.headers["Location"] == f"/v1/responses/{body['id']}"
    task = store.get_task(body["task"]["id"])
    assert task["status"] == "queued" and task["last_sequence_number"] == 2


def test_stream_sends_committed_events_in_order(user, store):
    result = create(user, stream=True)
    assert result.status_code == 200
    assert result.headers["Content-Type"].startswith("text/event-stream")
    assert result.headers["Cache-Control"] == "no-cache"
    assert result.headers["X-Accel-Buffering"] == "no"
    frames = parse_sse(result.text)
    seqs = [int(f["id"]) for f in frames]
    # the log's numbers: the task.* events of the log are not in a response stream
    log = store.events(frames[0]["data"]["response"]["task"]["id"])["data"]
    assert seqs == [e["sequence_number"] for e in log if not e["type"].startswith("task.")]
    assert len(seqs) < len(log) and seqs == sorted(set(seqs))
    for frame in frames:
        assert frame["event"] == frame["data"]["type"]
        assert frame["data"]["sequence_number"] == int(frame["id"])
    assert frames[0]["event"] == "response.created" and frames[-1]["event"] == "response.completed"
    text = "".join(f["data"]["delta"] for f in frames if f["event"] == "response.output_text.delta")
    assert text == frames[-1]["data"]["response"]["output"][0]["content"][0]["text"]
    # framing is exactly id, event, data, blank line
    first = result.text.split("\n\n")[0].split("\n")
    assert [line.split(":")[0] for line in first] == ["id", "event", "data"]


def test_background_stream_starts_with_created(user):
    result = create(user, stream=True, background=True)
    frames = parse_sse(result.text)
    assert frames[0]["event"] == "response.created"
    assert frames[0]["data"]["response"]["background"] is True
    assert frames[-1]["event"] in TERMINAL


def test_instructions_and_messages(user, store, scripted):
    body = create(user, instructions="Be brief.", input=[
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "x"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "And now?"}]},
    ]).json
    assert body["status"] == "completed"
    # the conversation the model is given: instructions first, every turn in order, the
    # OpenAI "developer" role as system, content parts joined into text
    assert scripted.checked == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                {"role": "assistant", "content": "Hello"}, {"role": "system", "content": "x"},
                                {"role": "user", "content": "And now?"}]


def test_max_output_tokens_is_capped_and_defaulted(user, config):
    assert create(user).json["max_output_tokens"] == config.max_output_tokens
    assert create(user, max_output_tokens=10**6).json["max_output_tokens"] == config.max_output_tokens_cap


def test_on_restart_defaults_to_the_service_setting(user, config):
    assert create(user).json["task"]["on_restart"] == "fail"  # B.5: "fail" as shipped


def test_store_false_is_deleted_once_delivered(user):
    body = create(user, store=False).json
    assert body["status"] == "completed"
    assert_error(user.get(f"/v1/responses/{body['id']}"), 404, "not_found")
    streamed = parse_sse(create(user, store=False, stream=True).text)
    rid = streamed[0]["data"]["response"]["id"]
    assert_error(user.get(f"/v1/responses/{rid}"), 404, "not_found")


def test_store_false_is_deleted_when_its_client_leaves_the_stream(app, user, scripted, store):
    """The client of a store: false stream goes away before the end: its task is
    cancelled and, once it has ended, the response is deleted all the same."""
    scripted.auto = False  # nobody runs the task: the stream waits on it
    body = json.dumps({"model": "tiny", "input": "hi", "stream": True, "store": False}).encode()
    env = falcon.testing.create_environ("/v1/responses", method="POST", body=body,
                                        headers={"Authorization": f"Bearer {user.token}",
                                                 "Content-Type": "application/json"})
    started = []
    frames = app(env, lambda status, headers, exc_info=None: started.append(status))
    first = next(iter(frames))  # response.created
    assert started == ["200 OK"] and b"response.created" in first
    rid = parse_sse(first.decode())[0]["data"]["response"]["id"]
    frames.close()  # the client went away
    deadline = time.monotonic() + 30  # a guard only: the deletion follows the cancel's commit
    while True:
        got = user.get(f"/v1/responses/{rid}")
        if got.status_code == 404:
            break
        assert got.json["status"] in ("queued", "cancelled"), got.json
        assert time.monotonic() < deadline, "the response was not deleted"
        time.sleep(0.02)
    assert_error(got, 404, "not_found")


def test_a_chunked_body_over_the_limit_is_413(app, user, config):
    """A body without Content-Length (sent in chunks, which the server decodes) is read up
    to the limit and refused past it, as one with a length is."""
    import io
    big = json.dumps({"model": "tiny", "input": "x" * config.max_body_bytes}).encode()
    env = falcon.testing.create_environ("/v1/responses", method="POST",
                                        headers={"Authorization": f"Bearer {user.token}",
                                                 "Content-Type": "application/json",
                                                 "Transfer-Encoding": "chunked"})
    env.pop("CONTENT_LENGTH", None)
    env["wsgi.input"] = io.BytesIO(big)
    started = []
    body = b"".join(app(env, lambda status, headers, exc_info=None: started.append(status)))
    assert len(started) == 1 and started[0].startswith("413 "), started
    assert json.loads(body)["error"]["code"] == "payload_too_large"


BAD_FIELDS = [
    ({"model": None}, "model"),
    ({"model": 3}, "model"),
    ({"model": ""}, "model"),
    ({"input": None}, "input"),
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
    ({"input": [5]}, "input[0]"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user"}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": "x", "name": "bob"}]}, "input[0].name"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "web_search_call", "role": "user", "content": "x"}]}, "input[0].type"),
    ({"instructions": 5}, "instructions"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": "10"}, "max_output_tokens"),
    ({"max_output_tokens": 1.5}, "max_output_tokens"),
    ({"max_output_tokens": True}, "max_output_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.1}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"top_k": 0.5}, "top_k"),
    ({"seed": -1}, "seed"),
    ({"seed": 2**40}, "seed"),
    ({"seed": "7"}, "seed"),
    ({"stop": 5}, "stop"),
    ({"stop": [""]}, "stop[0]"),
    ({"stop": ["a"] * 17}, "stop"),
    ({"stream": "yes"}, "stream"),
    ({"background": 1}, "background"),
    ({"store": "no"}, "store"),
    ({"background": True, "store": False}, "store"),
    ({"on_restart": "never"}, "on_restart"),
    ({"metadata": []}, "metadata"),
    ({"metadata": {"k": 1}}, "metadata.k"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"tools": "x"}, "tools"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"previous_response_id": ["resp_x"]}, "previous_response_id"),
]


@pytest.mark.parametrize("fields,param", BAD_FIELDS)
def test_field_validation(user, store, fields, param):
    assert_error(create(user, **fields), 400, "invalid_request", param=param)
    assert store.list_tasks()["data"] == []  # nothing was created


def test_unknown_model_is_404(user):
    assert_error(create(user, model="nope"), 404, "not_found", param="model")


def test_context_length_is_checked(user):
    assert_error(create(user, input="word " * 2000), 400, "context_length_exceeded", param="input")


def test_list_pages_newest_first(user, other):
    ids = [create(user).json["id"] for _ in range(3)]
    create(other)
    page = user.get("/v1/responses", params={"limit": "2"}).json
    assert page["object"] == "list" and page["has_more"] is True
    assert [r["id"] for r in page["data"]] == ids[::-1][:2]
    rest = user.get("/v1/responses", params={"limit": "2", "after": page["last_id"]}).json
    assert [r["id"] for r in rest["data"]] == [ids[0]] and rest["has_more"] is False
    done = user.get("/v1/responses", params={"status": "completed"}).json
    assert len(done["data"]) == 3
    assert user.get("/v1/responses", params={"status": "queued"}).json["data"] == []
    assert_error(user.get("/v1/responses", params={"status": "odd"}), 400, "invalid_request", "status")
    assert_error(user.get("/v1/responses", params={"limit": "0"}), 400, "invalid_request", "limit")
    assert_error(user.get("/v1/responses", params={"limit": "x"}), 400, "invalid_request", "limit")
    assert_error(user.get("/v1/responses", params={"after": "task_1"}), 400, "invalid_request", "after")


def test_admin_sees_every_clients_responses(user, admin):
    rid = create(user).json["id"]
    assert admin.get(f"/v1/responses/{rid}").status_code == 200
    assert rid in [r["id"] for r in admin.get("/v1/responses").json["data"]]


def test_isolation_between_clients(user, other, scripted):
    scripted.auto = False
    body = create(user, background=True).json
    rid, tid = body["id"], body["task"]["id"]
    for method, path in [("GET", f"/v1/responses/{rid}"), ("DELETE", f"/v1/responses/{rid}"),
                         ("POST", f"/v1/responses/{rid}/cancel"), ("GET", f"/v1/tasks/{tid}"),
                         ("POST", f"/v1/tasks/{tid}/cancel"), ("GET", f"/v1/tasks/{tid}/events")]:
        err = assert_error(other.request(method, path), 404, "not_found")
        # the same answer as for an id nobody has: nothing of the other client's task shows
        unknown = assert_error(other.request(method, path.replace(rid, rid[:-4] + "ZZZZ")
                                             .replace(tid, tid[:-4] + "ZZZZ")), 404, "not_found")
        assert err["message"] == unknown["message"].replace(rid[:-4] + "ZZZZ", rid).replace(
            tid[:-4] + "ZZZZ", tid), (method, path, err)
    assert_error(other.get(f"/v1/responses/{rid}", params={"stream": "true"}), 404, "not_found")
    assert_error(other.get(f"/v1/tasks/{tid}/events", headers={"Accept": "text/event-stream"}), 404,
                 "not_found")
    assert other.get("/v1/responses").json["data"] == []
    assert other.get("/v1/tasks").json["data"] == []
    assert user.get(f"/v1/tasks/{tid}").json["status"] == "queued"  # untouched


def test_delete(user, scripted):
    done = create(user).json
    deleted = user.delete(f"/v1/responses/{done['id']}")
    assert deleted.json == {"id": done["id"], "object": "response", "deleted": True}
    assert_error(user.get(f"/v1/responses/{done['id']}"), 404, "not_found")
    assert_error(user.get(f"/v1/tasks/{done['task']['id']}"), 404, "not_found")
    assert_error(user.delete(f"/v1/responses/{done['id']}"), 404, "not_found")
    scripted.auto = False
    pending = create(user, background=True).json
    assert_error(user.delete(f"/v1/responses/{pending['id']}"), 409, "task_unfinished")


def test_stream_resume_with_starting_after(user):
    body = create(user).json
    full = parse_sse(user.get(f"/v1/responses/{body['id']}", params={"stream": "true"}).text)
    assert int(full[0]["id"]) == 1 and full[-1]["event"] == "response.completed"
    tail = parse_sse(user.get(f"/v1/responses/{body['id']}",
                              params={"stream": "true", "starting_after": "5"}).text)
    assert [int(f["id"]) for f in tail] == [int(f["id"]) for f in full if int(f["id"]) > 5]
    assert not [f for f in full + tail if f["event"].startswith("task.")]  # the task's log has them
    by_header = parse_sse(user.get(f"/v1/responses/{body['id']}", params={"stream": "true"},
                                   headers={"Last-Event-ID": "5"}).text)
    assert by_header == tail
    past_end = user.get(f"/v1/responses/{body['id']}",
                        params={"stream": "true", "starting_after": full[-1]["id"]})
    assert past_end.status_code == 200 and parse_sse(past_end.text) == []
    assert_error(user.get(f"/v1/responses/{body['id']}", params={"stream": "true", "starting_after": "-1"}),
                 400, "invalid_request", "starting_after")
    assert_error(user.get(f"/v1/responses/{body['id']}", params={"stream": "maybe"}), 400,
                 "invalid_request", "stream")


def test_event_data_is_one_line_json(user, scripted):
    scripted.text = 'line one\nline "two"\r\n\u2028end'
    result = create(user, stream=True)
    frames = parse_sse(result.text)
    text = "".join(f["data"]["delta"] for f in frames if f["event"] == "response.output_text.delta")
    assert text == scripted.text
    for block in result.text.split("\n\n"):
        if block:
            assert len(block.split("\n")) == 3
            json.loads(block.split("\n")[2][len("data: "):])


def test_no_new_responses_while_not_ready(user, scripted, store):
    scripted.ready = False
    result = create(user, background=True)
    assert_error(result, 503, "unavailable")
    assert result.headers["Retry-After"] == "1"
    assert store.list_tasks()["data"] == []


def test_parse_create_without_http(config):
    parsed = parse_create({"model": "tiny", "input": "hi", "instructions": "Be brief."}, config, lambda: 99)
    assert parsed.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert parsed.request["seed"] == 99 and parsed.request["stop"] == []
    assert parsed.request["max_output_tokens"] == config.max_output_tokens
    assert parsed.request["on_restart"] == "fail"
    assert (parsed.background, parsed.stream, parsed.store) == (False, False, True)
    parsed = parse_create({"model": "tiny", "input": [{"role": "developer", "content": "x"}],
                           "stop": "END", "seed": 0}, config, lambda: 99)
    assert parsed.messages == [{"role": "system", "content": "x"}]
    assert parsed.request["stop"] == ["END"] and parsed.request["seed"] == 0


def test_empty_instructions_are_an_empty_system_message(config):
    """As llama-server makes them: a template's default system message gives way to it."""
    parsed = parse_create({"model": "tiny", "input": "hi", "instructions": ""}, config, lambda: 99)
    assert parsed.messages == [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}]
    assert parsed.request["instructions"] == ""
    parsed = parse_create({"model": "tiny", "input": "hi", "instructions": None}, config, lambda: 99)
    assert parsed.messages == [{"role": "user", "content": "hi"}]


def test_a_client_cannot_fill_the_queue_for_the_others(store, scripted, config):
    from api_helpers import Api, make_client

    from lmsp.app import create_app

    app = create_app(config.replace(max_unfinished_per_client=3), store, scripted)
    user, other, admin = (Api(app, make_client(store, scopes, name)[1]) for name, scopes in (
        ("u", ["responses:write", "responses:read"]), ("o", ["responses:write"]), ("a", ["admin"])))
    scripted.auto = False  # nothing runs: every task stays queued
    body = {"model": "tiny", "input": "hi", "background": True}
    for i in range(3):
        assert user.post("/v1/responses", json=body, headers={"Idempotency-Key": f"cap-{i}"}).status_code == 202
    refused = user.post("/v1/responses", json=body)
    assert_error(refused, 429, "rate_limited")
    assert int(refused.headers["Retry-After"]) >= 1
    # a replay is not a new task; another client and an admin are not held back
    assert user.post("/v1/responses", json=body, headers={"Idempotency-Key": "cap-0"}).status_code == 202
    assert other.post("/v1/responses", json=body).status_code == 202
    assert admin.post("/v1/responses", json=body).status_code == 202
    # a task that ends frees its place
    task_id = user.get("/v1/tasks").json["data"][0]["id"]
    assert user.post(f"/v1/tasks/{task_id}/cancel").status_code == 200
    assert user.post("/v1/responses", json=body).status_code == 202
