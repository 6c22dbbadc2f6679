"""Open Responses conformance (B.11) with the scripted worker: the Response object's
fields, the response streams without task events, and the checker that the
conftest runs on every answer of the API tests (open_responses.py)."""
from __future__ import annotations

import json

import falcon.testing
import jsonschema
import pytest
from api_helpers import parse_sse
from open_responses import CheckedApp, Conformance

from lmsp.app import create_app
from lmsp.store import Store

OPEN_RESPONSES_FIELDS = {
    "id", "object", "created_at", "completed_at", "status", "incomplete_details", "model", "previous_response_id",
    "instructions", "output", "error", "tools", "tool_choice", "truncation", "parallel_tool_calls", "text", "top_p",
    "presence_penalty", "frequency_penalty", "top_logprobs", "temperature", "reasoning", "usage",
    "max_output_tokens", "max_tool_calls", "store", "background", "service_tier", "metadata", "safety_identifier",
    "prompt_cache_key",
}


def create(api, **fields):
    body = {"model": "tiny", "input": "Say hello"}
    body.update(fields)
    return api.post("/v1/responses", json=body)


@pytest.fixture
def held(scripted):
    scripted.auto = False
    return scripted


def test_the_checker_refuses_what_open_responses_does_not_allow(user):
    body = create(user).json
    checker = Conformance()
    checker.check_response(body)
    for field in ("tools", "completed_at", "prompt_cache_key"):
        with pytest.raises(jsonschema.ValidationError):
            checker.check_response({k: v for k, v in body.items() if k != field})
    with pytest.raises(jsonschema.ValidationError):
        checker.check_response({**body, "truncation": "sometimes"})
    task_event = {"type": "task.running", "sequence_number": 3, "task": {}}
    with pytest.raises(AssertionError, match="does not know"):
        checker.check_event(task_event)  # in a response stream
    checker.check_event(task_event, in_log=True)  # LMSP's own, in the task's log
    with pytest.raises(jsonschema.ValidationError):
        checker.check_event({"type": "response.output_text.delta", "sequence_number": 4, "delta": "x"})


def test_every_way_of_getting_a_response_is_checked(user, scripted, open_responses_conformance):
    """The conftest's fixture validated each of these answers (it raises otherwise)."""
    rid = create(user).json["id"]
    create(user, stream=True)
    create(user, stream=True, background=True)
    user.get(f"/v1/responses/{rid}")
    user.get("/v1/responses")
    user.get(f"/v1/responses/{rid}", params={"stream": "true"})
    user.get(f"/v1/responses/{rid}", params={"stream": "true", "starting_after": "3"})
    scripted.auto = False
    queued = create(user, background=True).json
    scripted.start_all()
    user.get(f"/v1/tasks/{queued['task']['id']}/events")
    user.post(f"/v1/responses/{queued['id']}/cancel")
    scripted.step(queued["task"]["id"], "", "cancelled")
    user.get(f"/v1/responses/{queued['id']}", params={"stream": "true"})
    assert open_responses_conformance.responses >= 10 and open_responses_conformance.events >= 20


def test_response_object_has_every_field_with_its_default(user):
    body = create(user).json
    assert OPEN_RESPONSES_FIELDS <= set(body) and {"task", "seed"} <= set(body)
    assert body["completed_at"] >= body["created_at"] and body["status"] == "completed"
    assert body["previous_response_id"] is None and body["instructions"] is None
    assert body["tools"] == [] and body["tool_choice"] == "auto" and body["truncation"] == "disabled"
    assert body["parallel_tool_calls"] is True and body["max_tool_calls"] is None
    assert body["text"] == {"format": {"type": "text"}, "verbosity": "medium"}
    assert body["presence_penalty"] == 0 and body["frequency_penalty"] == 0 and body["top_logprobs"] == 0
    assert body["reasoning"] == {"effort": None, "summary": None}  # no model here reasons
    assert body["store"] is True and body["service_tier"] == "default"
    assert body["safety_identifier"] is None and body["prompt_cache_key"] is None
    part = body["output"][0]["content"][0]
    assert part["annotations"] == [] and part["logprobs"] == []


def test_the_openai_packages_own_types_take_the_response_as_they_are(user):
    from openai.types.responses import Response

    body = create(user).json
    parsed = Response.model_validate(body)  # strict: every field its types require
    details = parsed.usage.input_tokens_details
    assert details.cache_write_tokens == body["usage"]["input_tokens"] - details.cached_tokens


def test_unfinished_response_has_no_completed_at(user, held):
    body = create(user, background=True).json
    assert body["status"] == "queued" and body["completed_at"] is None


TOLERATED = dict(
    instructions="Be brief.", include=["message.output_text.logprobs", "reasoning.encrypted_content"],
    truncation="auto", tool_choice="none", tools=[], parallel_tool_calls=False, max_tool_calls=3,
    user="u-1", safety_identifier="s-1", prompt_cache_key="chat-42", service_tier="auto",
    stream_options={"include_obfuscation": False}, presence_penalty=0, frequency_penalty=0.0,
    reasoning={"effort": "high", "summary": "auto"}, text={"format": {"type": "text"}, "verbosity": "medium"},
    top_logprobs=2, store=True,
)


def test_fields_that_ask_for_nothing_are_accepted_and_echoed(user):
    body = create(user, **TOLERATED)
    assert body.status_code == 200, body.text
    out = body.json
    assert out["instructions"] == "Be brief." and out["truncation"] == "auto" and out["tool_choice"] == "none"
    assert out["parallel_tool_calls"] is False and out["max_tool_calls"] == 3 and out["top_logprobs"] == 2
    assert out["safety_identifier"] == "s-1" and out["prompt_cache_key"] == "chat-42" and out["user"] == "u-1"
    assert out["service_tier"] == "default"  # what "auto" picks: the one tier there is
    assert out["reasoning"] == {"effort": None, "summary": None}  # asked for, but the model does not reason


def test_nulls_for_optional_fields_are_the_defaults(user):
    nulls = {name: None for name in (
        "instructions", "include", "truncation", "tool_choice", "tools", "parallel_tool_calls", "max_tool_calls",
        "user", "safety_identifier", "prompt_cache_key", "service_tier", "stream_options", "presence_penalty",
        "frequency_penalty", "reasoning", "text", "top_logprobs", "previous_response_id", "conversation", "prompt",
        "max_output_tokens", "temperature", "top_p", "metadata", "stream", "background", "store")}
    result = create(user, **nulls)
    assert result.status_code == 200, result.text
    assert result.json["tool_choice"] == "auto" and result.json["store"] is True


def test_history_with_a_response_output_is_accepted(user, scripted):
    """``input = history + response.output``, items as the SDKs echo them."""
    first = create(user, input=[{"role": "user", "content": "Hi"}], include=["message.output_text.logprobs"]).json
    history = [{"role": "user", "content": "Hi"}, *first["output"],
               {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None},
               {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And?"}],
                "id": None, "status": None}]
    result = create(user, input=history)
    assert result.status_code == 200, result.text
    assert [m["role"] for m in scripted.checked] == ["user", "assistant", "user"]
    assert scripted.checked[1]["content"] == "Hello from the scripted worker"


BAD = [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["x"]}]}, "tools[0].type"),
    ({"tools": {}}, "tools"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"text": "plain"}, "text"),
    ({"include": ["file_search_call.results"]}, "include[0]"),
    ({"include": ["message.output_text.logprobs", 5]}, "include[1]"),
    ({"include": "message.output_text.logprobs"}, "include"),
    ({"truncation": "middle"}, "truncation"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": -1}, "top_logprobs"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": -1}, "frequency_penalty"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"service_tier": "flex"}, "service_tier"),
    ({"service_tier": "priority"}, "service_tier"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"max_tool_calls": 0}, "max_tool_calls"),
    ({"stream_options": {"include_usage": True}}, "stream_options.include_usage"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"reasoning": "high"}, "reasoning"),
    ({"previous_response_id": 7}, "previous_response_id"),
    ({"conversation": {"id": "conv_x", "name": "x"}}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "output_text", "text": "x", "extra": 1}]}]},
     "input[0].content[0].extra"),
    ({"input": [{"role": "user", "content": "x", "id": 5}]}, "input[0].id"),
    ({"input": [{"role": "user", "content": "x", "status": 1}]}, "input[0].status"),
    ({"input": [{"type": "reasoning", "summary": "x"}, "hi"]}, "input[0].summary"),
    ({"input": [{"role": "assistant", "content": [{"type": "output_text", "text": "x", "annotations": 5}]}]},
     "input[0].content[0].annotations"),
]


@pytest.mark.parametrize("fields,param", BAD)
def test_what_would_silently_not_happen_is_refused(user, store, fields, param):
    result = create(user, **fields)
    assert result.status_code == 400, result.text
    error = result.json["error"]
    assert error["code"] == "invalid_request" and error["param"] == param and error["message"]
    assert store.list_tasks()["data"] == []


def document_validator(anon):
    doc = anon.get("/openapi.json").json
    return jsonschema.Draft202012Validator({"$ref": "#/components/schemas/CreateResponse",
                                            "components": doc["components"]})


@pytest.mark.parametrize("fields,param", BAD)
def test_what_the_service_refuses_its_openapi_document_refuses(anon, fields, param):
    assert not document_validator(anon).is_valid({"model": "tiny", "input": "Say hello", **fields})


def test_its_openapi_document_allows_what_clients_send(anon):
    first = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": [
        {"type": "output_text", "text": "Hi", "annotations": [], "logprobs": []}, {"type": "refusal", "refusal": ""}]}
    history = [{"role": "user", "content": "Hi"}, first, {"type": "reasoning", "id": "rs_1", "summary": []}]
    assert document_validator(anon).is_valid({"model": "tiny", "input": history, **TOLERATED})


def test_the_stored_response_after_a_restart_conforms(config, store, scripted, clock, user):
    rid = create(user, instructions="Be brief.", prompt_cache_key="k").json["id"]
    store.close()
    reopened = Store.open(config.db_path, durability="off", clock=clock)
    try:
        app = create_app(config, reopened, scripted, clock=clock, random_seed=lambda: 1)
        again = type(user)(app, user.token)
        body = again.get(f"/v1/responses/{rid}").json
        Conformance().check_response(body)
        assert body["instructions"] == "Be brief." and body["prompt_cache_key"] == "k"
    finally:
        reopened.close()


def test_answers_the_app_sends_without_an_api_are_checked_too(app, user, open_responses_conformance):
    """The openai package over a WSGI transport, or a raw WSGI call, reach the app past
    any Api: the app fixture itself checks what it sends."""
    env = falcon.testing.create_environ(path="/v1/responses", method="POST",
                                        body=json.dumps({"model": "tiny", "input": "Hi", "stream": True}),
                                        headers={"Authorization": f"Bearer {user.token}",
                                                 "Content-Type": "application/json"})
    body = b"".join(app(env, lambda status, headers, exc_info=None: None))
    assert b"response.completed" in body
    assert open_responses_conformance.events >= 8 and open_responses_conformance.responses >= 4

    def bad_app(environ, start_response):
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps({"id": "resp_1", "object": "response"}).encode()]

    with pytest.raises(jsonschema.ValidationError):
        b"".join(CheckedApp(bad_app, Conformance())(falcon.testing.create_environ(path="/v1/responses/resp_1"),
                                                    lambda status, headers, exc_info=None: None))


def test_the_completed_event_carries_completed_at(user):
    frames = parse_sse(create(user, stream=True).text)
    final = frames[-1]["data"]
    assert final["type"] == "response.completed"
    assert final["response"]["completed_at"] >= final["response"]["created_at"]
    assert frames[0]["data"]["response"]["completed_at"] is None
    assert not [f for f in frames if f["event"].startswith("task.")]
