"""Function tools on the real model (SmolLM2, whose chat template knows no
tools: the service's own call format). With ``tool_choice`` ``required`` or a
named tool a call with valid arguments is the only possible output; the tool
loop runs by resending the history; streamed calls are committed events,
identical on replay; a resume task killed inside a call's arguments
continues exactly."""
from __future__ import annotations

import json

import jsonschema
import pytest
from e2e_helpers import sse_events, start_running
from test_real_model import INSTRUCTIONS, MODEL, real_server, smollm2_fixtures

pytestmark = pytest.mark.real_model

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}
TIME = {
    "type": "function",
    "name": "get_time",
    "description": "The current time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
}
ASK = "What is the weather like in Paris today?"


server, token = smollm2_fixtures("tools")


def create(server, token, expect=200, **body) -> dict:
    return server.call("POST", "/v1/responses", {"model": MODEL, "instructions": INSTRUCTIONS, **body},
                       token=token, expect=expect)


def create_one(server, token, **body) -> dict:
    """A response that makes at most one call (``parallel_tool_calls`` false)."""
    return create(server, token, parallel_tool_calls=False, **body)


def the_call(response: dict) -> dict:
    [item] = response["output"]
    assert item["type"] == "function_call", response["output"]
    assert item["id"].startswith("fc_") and item["call_id"] and item["status"] == "completed"
    return item


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_required_gives_calls_with_valid_arguments(server, token, seed):
    response = create(server, token, input=ASK, tools=[WEATHER, TIME], tool_choice="required", seed=seed,
                      temperature=1.0, max_output_tokens=200, max_tool_calls=3)
    assert response["status"] == "completed" and 1 <= len(response["output"]) <= 3
    for call in response["output"]:  # parallel calls (the default): each a valid one
        assert call["type"] == "function_call" and call["status"] == "completed"
        tool = {"get_weather": WEATHER, "get_time": TIME}[call["name"]]
        jsonschema.validate(json.loads(call["arguments"]), tool["parameters"])
    assert len({c["call_id"] for c in response["output"]} | {c["id"] for c in response["output"]}) == 2 * len(
        response["output"])
    one = create_one(server, token, input=ASK, tools=[WEATHER, TIME], tool_choice="required", seed=seed,
                     temperature=1.0, max_output_tokens=200)
    the_call(one)
    assert response["tool_choice"] == "required" and [t["name"] for t in response["tools"]] == ["get_weather",
                                                                                               "get_time"]


def test_a_named_tool_is_the_one_called(server, token):
    response = create_one(server, token, input=ASK, tools=[WEATHER, TIME], temperature=0, max_output_tokens=120,
                          tool_choice={"type": "function", "name": "get_time"})
    call = the_call(response)
    assert call["name"] == "get_time"
    jsonschema.validate(json.loads(call["arguments"]), TIME["parameters"])


def test_auto_and_none(server, token):
    plain = create(server, token, input="Say hello.", tools=[WEATHER], tool_choice="none", temperature=0,
                   max_output_tokens=20)
    assert plain["output"][0]["type"] == "message"
    for seed in (1, 2, 3, 4, 5, 6):
        auto = create(server, token, input=ASK, tools=[WEATHER], seed=seed, max_output_tokens=120)
        [item] = auto["output"]
        if item["type"] == "function_call":  # once a call opens, the grammar holds it to a valid one
            assert auto["status"] == "completed"
            jsonschema.validate(json.loads(item["arguments"]), WEATHER["parameters"])
        else:
            assert not item["content"][0]["text"].lstrip().startswith("{")


def test_the_tool_loop_by_resent_history(server, token):
    first = create_one(server, token, input=ASK, tools=[WEATHER], tool_choice="required", temperature=0,
                       max_output_tokens=120)
    call = the_call(first)
    history = [{"role": "user", "content": ASK}, call,
               {"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny, 24 degrees."}]
    second = create(server, token, input=history, tools=[WEATHER], temperature=0, max_output_tokens=60)
    assert second["status"] in ("completed", "incomplete")
    assert second["output"][0]["type"] in ("message", "function_call")


def test_a_streamed_call_is_committed_events_identical_on_replay(server, token):
    body = {"model": MODEL, "instructions": INSTRUCTIONS, "input": ASK, "tools": [WEATHER],
            "tool_choice": "required", "temperature": 0, "max_output_tokens": 120, "parallel_tool_calls": False}
    plain = the_call(create(server, token, **{k: v for k, v in body.items() if k != "model"}))
    events = list(sse_events("127.0.0.1", server.port, "POST", "/v1/responses", token=token,
                             body={**body, "stream": True}, timeout=60))
    types = [e["type"] for e in events]
    added = events[types.index("response.output_item.added")]
    assert added["item"]["type"] == "function_call" and added["item"]["name"] == "get_weather"
    assert added["item"]["arguments"] == ""
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    done = events[types.index("response.function_call_arguments.done")]
    assert args == done["arguments"] == plain["arguments"]
    assert events[types.index("response.output_item.done")]["item"]["arguments"] == args
    assert "response.output_text.delta" not in types
    final = events[-1]["response"]
    assert final["status"] == "completed" and the_call(final)["arguments"] == args
    replay = list(sse_events("127.0.0.1", server.port, "GET", f"/v1/responses/{final['id']}?stream=true",
                             token=token, timeout=60))
    assert replay == events[1:] or replay == events


@pytest.mark.parametrize("fields,param", [
    ({"tools": [WEATHER, WEATHER]}, "tools[1].name"),
    ({"tools": [{**WEATHER, "name": "no spaces"}]}, "tools[0].name"),
    ({"tools": [{**WEATHER, "parameters": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}]},
     "tools[0].parameters.properties.a.$ref"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_time"}}, "tool_choice.name"),
    ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, "input[0].call_id"),
    ({"tools": [{**WEATHER, "parameters": {"enum": ["x" * 40000]}}]}, "tools[0].parameters"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_bad_tool_input_is_refused_and_nothing_is_stored(server, token, fields, param):
    before = server.call("GET", "/v1/responses?limit=100", token=token)["data"]
    error = create(server, token, expect=400, **{"input": ASK, **fields})["error"]
    assert (error["code"], error["param"]) == ("invalid_request", param)
    assert server.call("GET", "/v1/responses?limit=100", token=token)["data"] == before


SAVE = {
    "type": "function",
    "name": "save_story",
    "description": "Saves a story.",
    "parameters": {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]},
}
STORY = {"model": MODEL, "instructions": INSTRUCTIONS, "tools": [SAVE], "tool_choice": "required",
         "input": "Write a long story about a lighthouse keeper and save it.", "temperature": 0,
         "max_output_tokens": 200, "parallel_tool_calls": False}


def arguments_of(events) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")


@pytest.mark.slow  # a real service, crash and restart: seconds on 2 cores
def test_a_resume_task_killed_inside_a_calls_arguments_continues_exactly(tmp_path, server, token):
    whole = server.call("POST", "/v1/responses", {**STORY, "on_restart": "fail"}, token=token)
    [item] = whole["output"]
    assert item["type"] == "function_call" and len(item["arguments"]) > 300
    crashed = real_server(tmp_path)
    try:
        crashed.start(timeout=180)
        token2 = crashed.pair()
        [task_id] = start_running(crashed, token2, STORY, ["resume"], min_sequence=20).values()
        before = arguments_of(crashed.events(token2, task_id))
        assert 0 < len(before) < len(item["arguments"])
        crashed.kill()
        crashed.start(timeout=180)
        task = crashed.wait_task(token2, task_id, lambda t: t["status"] in ("completed", "failed", "cancelled"),
                                 timeout=180)
        assert task["attempts"] == 2
        events = crashed.events(token2, task_id)
        types = [e["type"] for e in events]
        assert types.count("task.resumed") == 1 and types.count("response.output_item.added") == 1
        response = crashed.call("GET", f"/v1/responses/{task['response_id']}", token=token2)
        [resumed] = response["output"]
        assert (resumed["name"], resumed["arguments"]) == (item["name"], item["arguments"])
        assert arguments_of(events) == item["arguments"]
        assert response["status"] == whole["status"]
    finally:
        crashed.stop(timeout=10)
