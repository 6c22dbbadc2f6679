"""Function tools with the scripted worker: each bad tool field or call item a 400
with its param and nothing stored; good ones kept with the task and echoed."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from api_fakes import OWNER
from api_helpers import assert_error
from open_responses import sse_data

from lmsp.runtime.committer import merge
from lmsp.runtime.calls import CallShaper

TOOL = {"type": "function", "name": "get_weather", "description": "The weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}
BAD = [
    ({"tools": [TOOL, TOOL]}, "tools[1].name"),
    ({"tools": [{**TOOL, "name": "has space"}]}, "tools[0].name"),
    ({"tools": [{**TOOL, "name": "x" * 65}]}, "tools[0].name"),
    ({"tools": [{**TOOL, "name": None}]}, "tools[0].name"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": ["get_weather"]}, "tools[0]"),
    ({"tools": [{**TOOL, "parameters": [1]}]}, "tools[0].parameters"),
    ({"tools": [{**TOOL, "parameters": {"type": "string"}}]}, "tools[0].parameters"),
    ({"tools": [{**TOOL, "parameters": {"enum": ["x" * 40000]}}]}, "tools[0].parameters"),
    ({"tools": [{**TOOL, "strict": "yes"}]}, "tools[0].strict"),
    ({"tools": [{**TOOL, "extra": 1}]}, "tools[0].extra"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice.name"),
    ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": [TOOL], "max_tool_calls": 0}, "max_tool_calls"),
    ({"input": [OUTPUT]}, "input[0].call_id"),
    ({"input": [OUTPUT, CALL]}, "input[0].call_id"),
    ({"input": [{**CALL, "call_id": ""}]}, "input[0].call_id"),
    ({"input": [{**CALL, "arguments": {"city": "Paris"}}]}, "input[0].arguments"),
    ({"input": [{**CALL, "name": "a b"}]}, "input[0].name"),
    ({"input": [CALL, {**OUTPUT, "output": 5}]}, "input[1].output"),
]


def create(api, **fields):
    return api.post("/v1/responses", json={"model": "tiny", "input": "Say hello", **fields})


@pytest.mark.parametrize("fields,param", BAD)
def test_bad_tool_input_is_refused_and_nothing_is_stored(user, fields, param):
    before = user.get("/v1/responses").json["data"]
    assert_error(create(user, **fields), 400, "invalid_request", param=param)
    assert user.get("/v1/responses").json["data"] == before


def test_tools_and_call_items_are_kept_and_echoed(user):
    body = create(user, tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"},
                  parallel_tool_calls=False, max_tool_calls=2, include=[],
                  input=[{"role": "user", "content": "Weather?"}, {**CALL, "id": "fc_1", "status": "completed"},
                         {**OUTPUT, "output": [{"type": "input_text", "text": "Sunny"}]}]).json
    assert body["tools"] == [{**TOOL, "strict": True}]
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert (body["parallel_tool_calls"], body["max_tool_calls"]) == (False, 2)
    plain = create(user, tools=[]).json
    assert (plain["tools"], plain["tool_choice"], plain["parallel_tool_calls"]) == ([], "auto", True)


@pytest.mark.parametrize("fields", [
    {"tools": [TOOL], "tool_choice": "none"},
    {"text": {"format": {"type": "text"}}},
    {"tools": [TOOL]},
    {"tools": [TOOL], "tool_choice": "required"},
    {"text": {"format": {"type": "json_object"}}},
])
def test_logprobs_are_kept_with_or_without_a_grammar(user, fields):
    """With a grammar (a JSON format, tools the model may call) the engine reports the
    distribution over the tokens it allows: the request is taken as any other."""
    body = create(user, top_logprobs=2, include=["message.output_text.logprobs"], **fields).json
    assert body["top_logprobs"] == 2
    [part] = body["output"][0]["content"]
    assert part["logprobs"] and all(len(e["top_logprobs"]) == 2 for e in part["logprobs"])


def test_a_function_call_and_its_events_conform_to_open_responses(user, scripted, store,
                                                                  open_responses_conformance):
    """A call made as the committer makes it from the engine's text: the Response's
    FunctionCall item and the stream's function_call_arguments events pass the
    Open Responses schemas (the autouse conformance fixture checks each)."""
    scripted.auto = False
    body = create(user, tools=[TOOL], tool_choice="required", background=True).json
    [claim] = scripted.start_all()
    run = SimpleNamespace(task_id=claim["task_id"], attempt=claim["attempts"], engine=None,
                          calls=CallShaper.for_request(claim["request"]))
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    pieces = [text[:10], text[10:30], text[30:45], text[45:]]
    for i, piece in enumerate(pieces):
        final = i == len(pieces) - 1
        result = {"text": piece, "tokens": [i + 1], "finish": "stop" if final else None, "n_prompt": 3,
                  "n_generated": i + 1}
        store.append_step(OWNER, [merge(None, run, result)])  # type: ignore[arg-type]
    done = user.get(f"/v1/responses/{body['id']}").json
    [call] = done["output"]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert call["arguments"] == '{"city": "Paris"}' and call["status"] == "completed"
    frames = user.get(f"/v1/responses/{body['id']}", params={"stream": "true"}).text
    kinds = [event["type"] for event in sse_data(frames)]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert open_responses_conformance.responses >= 2 and open_responses_conformance.events >= len(kinds)
