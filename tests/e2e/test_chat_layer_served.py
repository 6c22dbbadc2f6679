"""The chat layer through the served API, on demo models whose templates know
tools or think (tests/chat_templates.py): streamed calls and reasoning are
committed events, the same on replay, and pass the Open Responses schemas; the
tool loop by resent history reaches the template as tool calls and outputs, the
same prompt from Chat Completions' messages; truncation fits a long history."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from e2e_helpers import Server, sse_events

from lmsp.models.demo import write_demo_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chat_templates import THINK_TEMPLATE, TOOLS_TEMPLATE  # noqa: E402
from open_responses import Conformance  # noqa: E402

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
    "additionalProperties": False}}  # fmt: skip


def _serve(tmp_path_factory, name: str, template: str):
    root = tmp_path_factory.mktemp(name)
    model = write_demo_model(root / f"{name}.gguf", chat_template=template)
    server = Server(root / "data", root, model, {"LMSP_N_PARALLEL": "2"})
    server.start()
    token = server.pair()
    [listed] = server.call("GET", "/v1/models", token=token)["data"]
    yield server, token, listed["id"]
    server.stop(timeout=10)


@pytest.fixture(scope="module")
def tools_served(tmp_path_factory):
    yield from _serve(tmp_path_factory, "tools", TOOLS_TEMPLATE)


@pytest.fixture(scope="module")
def think_served(tmp_path_factory):
    yield from _serve(tmp_path_factory, "think", THINK_TEMPLATE)


def stream_and_replay(server, token, body):
    events = list(sse_events("127.0.0.1", server.port, "POST", "/v1/responses", token=token,
                             body={**body, "stream": True}, timeout=60))
    final = events[-1]["response"]
    replay = list(sse_events("127.0.0.1", server.port, "GET", f"/v1/responses/{final['id']}?stream=true",
                             token=token, timeout=60))
    assert replay == events[1:] or replay == events
    check = Conformance()
    for event in events:
        check.check_event(event)
    stored = server.call("GET", f"/v1/responses/{final['id']}", token=token)
    check.check_response(stored)
    assert stored["output"] == final["output"]
    return events, final


def test_streamed_calls_in_the_models_format(tools_served):
    server, token, model = tools_served
    events, final = stream_and_replay(server, token, {"model": model, "input": "Weather?", "tools": [WEATHER],
                                                      "tool_choice": "required", "max_output_tokens": 80,
                                                      "seed": 11})
    calls = final["output"]
    assert calls and all(c["type"] == "function_call" and c["name"] == "get_weather" for c in calls)
    for call in calls:  # several where parallel_tool_calls lets the model make them
        args = "".join(e["delta"] for e in events
                       if e["type"] == "response.function_call_arguments.delta" and e["item_id"] == call["id"])
        assert args == call["arguments"]
        assert '"city"' in args or call["status"] == "incomplete"  # the last may be cut by max_output_tokens
    assert len({c["call_id"] for c in calls}) == len(calls)
    assert all(c["status"] == "completed" for c in calls[:-1])


def test_one_call_without_parallel_calls(tools_served):
    server, token, model = tools_served
    one = server.call("POST", "/v1/responses", {"model": model, "input": "Weather?", "tools": [WEATHER],
                                                "tool_choice": "required", "parallel_tool_calls": False,
                                                "max_output_tokens": 80}, token=token)
    assert [item["type"] for item in one["output"]] == ["function_call"]


def test_the_tool_loop_reaches_the_template_as_calls(tools_served):
    server, token, model = tools_served
    first = server.call("POST", "/v1/responses", {"model": model, "input": "Weather?", "tools": [WEATHER],
                                                  "tool_choice": "required", "parallel_tool_calls": False,
                                                  "max_output_tokens": 80}, token=token)
    [call] = first["output"]
    history = [{"role": "user", "content": "Weather?"}, call,
               {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}]
    second = server.call("POST", "/v1/responses", {"model": model, "input": history, "tools": [WEATHER],
                                                   "max_output_tokens": 4}, token=token)
    assert second["status"] in ("completed", "incomplete")
    assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"]


def test_streamed_reasoning(think_served):
    server, token, model = think_served
    events, final = stream_and_replay(server, token, {"model": model, "input": "Hi", "max_output_tokens": 10,
                                                      "reasoning": {"effort": "low"}})
    [item] = final["output"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.reasoning.delta")
    assert item["type"] == "reasoning" and item["content"] == [{"type": "reasoning_text", "text": text}]
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    assert final["reasoning"]["effort"] == "low"


def test_chat_completions_on_the_chat_layer(tools_served, think_served):
    server, token, model = tools_served
    tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    answer = server.call("POST", "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "Weather?"}], "tools": [tool],
        "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 80}, token=token)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and '"city"' in call["function"]["arguments"]
    server, token, model = think_served
    answer = server.call("POST", "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6}, token=token)
    message = answer["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"] == ""
    assert answer["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


def _call_item(i: int, city: str) -> dict:
    arguments = f'{{"city": "{city}"}}'
    return {"type": "function_call", "call_id": f"call_{i}", "name": "get_weather", "arguments": arguments}


def test_a_chat_completions_history_is_the_prompt_of_the_same_items(tools_served):
    server, token, model = tools_served
    tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    calls = [{"id": c["call_id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
             for c in (_call_item(1, "Paris"), _call_item(2, "Rome"))]  # fmt: skip
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
                {"role": "tool", "tool_call_id": "call_2", "content": "Rain"}]  # fmt: skip
    chat = server.call("POST", "/v1/chat/completions", {"model": model, "messages": messages, "tools": [tool],
                                                        "max_tokens": 2}, token=token)  # fmt: skip
    items = [{"role": "user", "content": "Weather?"}, _call_item(1, "Paris"), _call_item(2, "Rome"),
             {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
             {"type": "function_call_output", "call_id": "call_2", "output": "Rain"}]  # fmt: skip
    response = server.call("POST", "/v1/responses", {"model": model, "input": items, "tools": [WEATHER],
                                                     "max_output_tokens": 2}, token=token)  # fmt: skip
    assert chat["usage"]["prompt_tokens"] == response["usage"]["input_tokens"]


def test_auto_truncation_fits_a_long_history(tools_served):
    server, token, model = tools_served
    history: list[dict] = []
    for i in range(40):  # about 110 tokens a turn: longer than the servers' context of 2048 (e2e_helpers)
        history += [{"role": "user", "content": f"question {i} " + "word " * 100}, _call_item(i, "Paris"),
                    {"type": "function_call_output", "call_id": f"call_{i}", "output": "Sunny"}]  # fmt: skip
    body = {"model": model, "input": [*history, {"role": "user", "content": "And now?"}], "tools": [WEATHER],
            "max_output_tokens": 4}  # fmt: skip
    status, refused = server.request("POST", "/v1/responses", body, token=token, timeout=60)
    assert status == 400 and refused["error"]["code"] == "context_length_exceeded"
    fitted = server.call("POST", "/v1/responses", {**body, "truncation": "auto"}, token=token, timeout=120)
    assert fitted["status"] in ("completed", "incomplete") and fitted["truncation"] == "auto"
    assert 1500 < fitted["usage"]["input_tokens"] <= 2048 - 4


def test_the_messages_log_probabilities_as_the_openai_sdk_types_them(tools_served):
    from openai.types.chat import ChatCompletion
    from openai.types.responses import ResponseOutputMessage

    server, token, model = tools_served
    body = {"model": model, "input": "Weather?", "tools": [WEATHER], "tool_choice": "auto", "max_output_tokens": 12,
            "include": ["message.output_text.logprobs"], "top_logprobs": 2}
    events, final = stream_and_replay(server, token, body)
    [item] = final["output"]
    [part] = ResponseOutputMessage.model_validate(item).content
    deltas = [e for ev in events if ev["type"] == "response.output_text.delta" for e in ev["logprobs"]]
    assert part.logprobs and [lp.model_dump() for lp in part.logprobs] == deltas
    assert all(len(lp.top_logprobs) == 2 for lp in part.logprobs)
    chat = server.call("POST", "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 12,
        "tools": [{"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}],
        "logprobs": True, "top_logprobs": 2}, token=token)
    content = ChatCompletion.model_validate(chat).choices[0].logprobs.content
    assert content and all(len(c.top_logprobs) == 2 for c in content)
