"""Chat Completions (B.11) with the scripted worker: the request checked, the
answer in OpenAI's shape plain and streamed, a task of the store like a
response (idempotency, /v1/tasks, store), the stored ones read, listed and
deleted."""
from __future__ import annotations

import pytest
from api_helpers import assert_error, parse_sse

from lmsp.wire.chat import parse_chat

HELLO = "Hello from the scripted worker"


def chat(api, headers=None, **fields):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Say hello"}]}
    body.update(fields)
    return api.post("/v1/chat/completions", json=body, headers=headers)


def test_plain_answers_a_chat_completion(user, store):
    result = chat(user, temperature=0.5, max_tokens=8)
    assert result.status_code == 200, result.text
    body = result.json
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "tiny" and isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop" and choice["logprobs"] is None
    assert choice["message"] == {"role": "assistant", "content": HELLO, "refusal": None, "annotations": []}
    usage = body["usage"]
    assert usage["prompt_tokens"] == 3 and usage["completion_tokens"] >= 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 0
    assert body["task"]["status"] == "completed" and body["seed"] == 1234


def test_parse_without_http_defaults_to_not_stored_and_fail():
    parsed = parse_chat({"model": "tiny", "messages": [{"role": "user", "content": "x"}]}, _Config(), lambda: 1)
    assert parsed.on_restart == "fail" and parsed.store is False and parsed.stream is False
    assert parsed.kind == "chat.completion" and parsed.request["max_output_tokens"] == 16
    capped = parse_chat({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1000},
                        _Config(), lambda: 1)
    assert capped.request["max_output_tokens"] == 64


class _Config:
    max_output_tokens = 16
    max_output_tokens_cap = 64


def test_a_stored_completion_is_read_listed_and_deleted(user, other):
    first = chat(user, store=True, metadata={"k": "v"}).json
    second = chat(user, store=True).json
    assert user.get(f"/v1/chat/completions/{first['id']}").json["choices"] == first["choices"]
    assert user.get(f"/v1/chat/completions/{first['id']}").json["metadata"] == {"k": "v"}
    page = user.get("/v1/chat/completions").json
    assert page["object"] == "list" and [c["id"] for c in page["data"]] == [first["id"], second["id"]]
    assert page["data"][0]["object"] == "chat.completion"
    newest = user.get("/v1/chat/completions", params={"order": "desc", "limit": 1}).json
    assert [c["id"] for c in newest["data"]] == [second["id"]] and newest["has_more"] is True
    # responses and chat completions are listed apart
    assert user.get("/v1/responses").json["data"] == []
    assert_error(other.get(f"/v1/chat/completions/{first['id']}"), 404, "not_found")
    assert_error(user.get(f"/v1/responses/{first['id']}"), 404, "not_found")
    deleted = user.delete(f"/v1/chat/completions/{first['id']}")
    assert deleted.json == {"id": first["id"], "object": "chat.completion.deleted", "deleted": True}
    assert_error(user.get(f"/v1/chat/completions/{first['id']}"), 404, "not_found")


def test_without_store_it_is_gone_once_answered(user):
    body = chat(user).json
    assert_error(user.get(f"/v1/chat/completions/{body['id']}"), 404, "not_found")
    assert user.get("/v1/chat/completions").json["data"] == []


def test_stream_is_chunks_then_done(user):
    result = chat(user, stream=True, stream_options={"include_usage": True})
    assert result.status_code == 200, result.text
    assert result.headers["Content-Type"].startswith("text/event-stream")
    frames = parse_sse(result.text)
    assert all(set(f) == {"data"} for f in frames), frames
    assert frames[-1]["data"] == "[DONE]"
    chunks = [f["data"] for f in frames[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == HELLO
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["finish_reason"] for c in finish] == ["stop"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
    assert all(c["usage"] is None for c in chunks[:-1])


def test_stream_without_usage_has_no_usage_chunk(user):
    frames = parse_sse(chat(user, stream=True).text)
    chunks = [f["data"] for f in frames[:-1]]
    assert all("usage" not in c and c["choices"] for c in chunks)


def test_length_is_the_finish_reason_when_the_cap_stops_it(user, scripted):
    def run():
        for claim in scripted.start_all():
            scripted.finish(claim["task_id"], "cut", finish="length")

    scripted.run_queued = run  # type: ignore[method-assign]
    assert chat(user, max_completion_tokens=1).json["choices"][0]["finish_reason"] == "length"
    frames = parse_sse(chat(user, max_completion_tokens=1, stream=True).text)
    assert [f["data"]["choices"][0]["finish_reason"] for f in frames[:-1]][-1] == "length"


def test_a_failed_task_is_an_error(user, scripted):
    def fail():
        for claim in scripted.start_all():
            scripted.store.append_step("scripted-worker", [{
                "task_id": claim["task_id"], "delta": "", "finish": "error",
                "error": {"code": "model_load_failed", "message": "cannot load"}, "usage": None}])

    scripted.run_queued = fail  # type: ignore[method-assign]
    error = assert_error(chat(user), 500, "model_load_failed")
    assert error["message"] == "cannot load"


def test_idempotency_key_replays_without_a_second_task(user, store):
    headers = {"Idempotency-Key": "chat-1"}
    first = chat(user, headers=headers, store=True)
    again = chat(user, headers=headers, store=True)
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json["id"] == first.json["id"] and again.json["choices"] == first.json["choices"]
    assert len(user.get("/v1/tasks").json["data"]) == 1
    assert_error(chat(user, headers=headers, temperature=0.1), 422, "idempotency_key_reused")


def test_idempotency_key_replays_a_stream(user):
    headers = {"Idempotency-Key": "chat-stream"}
    first = chat(user, headers=headers, stream=True, store=True).text
    again = chat(user, headers=headers, stream=True, store=True)
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.text == first


def test_the_task_shows_in_tasks(user):
    body = chat(user, store=True).json
    task = user.get(f"/v1/tasks/{body['task']['id']}").json
    assert task["response_id"] == body["id"] and task["on_restart"] == "fail" and task["status"] == "completed"


def test_messages_go_to_the_template_with_their_roles(user, scripted):
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "system", "content": [{"type": "text", "text": "Sys "}, {"type": "text", "text": "two"}]},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "refusal": None, "tool_calls": []},
        {"role": "user", "content": [{"type": "text", "text": "Again"}]},
    ]
    assert chat(user, messages=messages).status_code == 200
    assert scripted.checked == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Sys two"},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Again"},
    ]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"logprobs": 1}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"top_logprobs": 0}, "top_logprobs"),
        ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "json_object", "strict": True}}, "response_format.strict"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "c"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]},
         "messages[0].content[0].type"),
        ({"messages": [{"role": "user", "content": "a\u0000b"}]}, "messages[0].content"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": "x"}, "max_completion_tokens"),
        ({"seed": -1}, "seed"),
        ({"stop": [""]}, "stop[0]"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_obfuscation": True}}, "stream_options.include_obfuscation"),
        ({"metadata": {"k": 1}}, "metadata.k"),
        ({"background": True}, "background"),
    ],
)
def test_bad_requests_are_400_with_their_param(user, fields, param):
    assert_error(chat(user, **fields), 400, "invalid_request", param=param)


def test_fields_that_ask_for_nothing_are_accepted(user):
    result = chat(user, n=1, presence_penalty=0, frequency_penalty=0.0, logprobs=False, tools=[],
                  tool_choice="none", parallel_tool_calls=True, response_format={"type": "text"},
                  user="", service_tier="auto", store=False)
    assert result.status_code == 200, result.text


def test_unknown_model_and_context(user):
    assert_error(chat(user, model="nope"), 404, "not_found", param="model")
    long = [{"role": "user", "content": "word " * 1200}]
    assert_error(chat(user, messages=long), 400, "context_length_exceeded")


def test_scopes(app, store):
    from api_helpers import Api, make_client

    reader = Api(app, make_client(store, ["responses:read"], "reader")[1])
    assert_error(chat(reader), 403, "insufficient_scope")
    assert reader.get("/v1/chat/completions").status_code == 200


def test_a_stream_whose_client_leaves_cancels_its_task(app, user, scripted, store):
    import json
    import time

    import falcon.testing

    scripted.auto = False  # nobody runs the task: the stream waits on it
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                       "store": True}).encode()
    env = falcon.testing.create_environ("/v1/chat/completions", method="POST", body=body,
                                        headers={"Authorization": f"Bearer {user.token}",
                                                 "Content-Type": "application/json"})
    frames = app(env, lambda status, headers, exc_info=None: None)
    first = next(iter(frames))  # the role chunk
    cid = parse_sse(first.decode())[0]["data"]["id"]
    frames.close()  # the client went away
    deadline = time.monotonic() + 30  # a guard only
    while user.get(f"/v1/chat/completions/{cid}").json["task"]["status"] != "cancelled":
        assert time.monotonic() < deadline, "the task was not cancelled"
        time.sleep(0.02)


def test_the_service_lists_the_openai_endpoints(anon):
    capabilities = anon.get("/v1/service").json["capabilities"]
    assert {"chat.completions", "completions", "embeddings"} <= set(capabilities)


def test_chunks_of_a_failed_or_cancelled_task_end_with_an_error_object():
    import json

    from lmsp.api.events import stopping_frame
    from lmsp.api.openai_shapes import ChunkFraming

    framing = ChunkFraming("chat.completion", {"id": "chatcmpl-1", "created_at": 1, "model": "tiny"})
    assert framing.event({"type": "task.running"}) == b""  # the task's own events are not chunks
    failed = framing.event({"type": "response.failed",
                            "response": {"error": {"code": "server_restarted", "message": "gone"}}})
    assert failed.startswith(b"data: ") and b"[DONE]" not in failed
    assert json.loads(failed[len(b"data: "):])["error"]["code"] == "server_restarted"
    cancelled = json.loads(framing.event({"type": "response.cancelled"})[len(b"data: "):])
    assert cancelled["error"]["code"] == "cancelled"
    stopping = json.loads(stopping_frame(7, framing)[len(b"data: "):])
    assert stopping["error"]["code"] == "server_stopping" and "chatcmpl-1" in stopping["error"]["message"]
    assert "send the request again" in stopping["error"]["message"]  # no resume: its policy is fail


def test_a_stored_completions_messages_are_listed(user, other):
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": [
        {"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}]
    cid = chat(user, messages=messages, store=True).json["id"]
    page = user.get(f"/v1/chat/completions/{cid}/messages").json
    assert [(m["role"], m["content"]) for m in page["data"]] == [("system", "Be brief."), ("user", "Hi there")]
    assert page["data"][0]["id"] == f"{cid}-0" and page["has_more"] is False
    first = user.get(f"/v1/chat/completions/{cid}/messages", params={"limit": 1, "order": "desc"}).json
    assert [m["content"] for m in first["data"]] == ["Hi there"] and first["has_more"] is True
    rest = user.get(f"/v1/chat/completions/{cid}/messages",
                    params={"order": "desc", "after": first["last_id"]}).json
    assert [m["content"] for m in rest["data"]] == ["Be brief."]
    assert_error(other.get(f"/v1/chat/completions/{cid}/messages"), 404, "not_found")
    assert_error(user.get(f"/v1/chat/completions/{cid}/messages", params={"after": "x"}), 400, "invalid_request")
