"""Function tools and structured output on Chat Completions with the scripted
worker: the request's tools, tool_choice and response_format kept as the
Responses API keeps them, a call answered as ``tool_calls`` (plain and as
chunks), calls and tool messages shown to the model as the Responses API shows
function call items, and each bad field a 400 naming it as the client sent it."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from api_fakes import OWNER
from api_helpers import assert_error, parse_sse

from lmsp import history
from lmsp.wire.chat import parse_chat
from lmsp.wire.chat_tools import chat_param
from lmsp.wire.responses import parse_create
from lmsp.errors import InvalidRequest
from lmsp.runtime import prompt as prompting
from lmsp.runtime.committer import merge
from lmsp.runtime.calls import CallShaper

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather.",
                                         "parameters": PARAMETERS}}
CALL_TEXT = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
ASSISTANT_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
TOOL_REPLY = {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}
ASK = {"role": "user", "content": "Weather in Paris?"}


def chat(api, **fields):
    body = {"model": "tiny", "messages": [ASK]}
    body.update(fields)
    return api.post("/v1/chat/completions", json=body)


@pytest.fixture
def calling(scripted, store):
    """The scripted worker answers with a call, its text shaped as the committer shapes it."""

    def finish(task_id, text, finish="stop"):
        task = store.get_task(task_id)
        request = store.get_request(task["response_id"])
        run = SimpleNamespace(task_id=task_id, attempt=task["attempts"],
                              engine=SimpleNamespace(token_bytes=lambda token: b"x"),
                              calls=CallShaper.for_request(request))
        pieces = [CALL_TEXT[:10], CALL_TEXT[10:30], CALL_TEXT[30:45], CALL_TEXT[45:]]
        for i, piece in enumerate(pieces):
            final = i == len(pieces) - 1
            result = {"text": piece, "tokens": [i + 1], "finish": finish if final else None, "n_prompt": 3,
                      "n_generated": i + 1}
            if request.get("include"):  # asked for log probabilities: the engine gives them
                result["logprobs"] = [-0.25]
            store.append_step(OWNER, [merge(None, run, result)])  # type: ignore[arg-type]

    scripted.finish = finish
    return scripted


def test_a_call_is_the_messages_tool_calls(user, calling):
    body = chat(user, tools=[TOOL], tool_choice="required", store=True).json
    [choice] = body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None and message["refusal"] is None
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert user.get(f"/v1/chat/completions/{body['id']}").json["choices"][0]["message"]["tool_calls"] == [call]


def test_a_call_cut_by_the_cap_has_finish_reason_length(user, calling):
    shaped = calling.finish
    calling.finish = lambda task_id, text, finish="stop": shaped(task_id, text, "length")
    body = chat(user, tools=[TOOL], tool_choice="required").json
    [choice] = body["choices"]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    frames = parse_sse(chat(user, tools=[TOOL], tool_choice="required", stream=True).text)
    assert [f["data"]["choices"][0]["finish_reason"] for f in frames[:-1]][-1] == "length"


def test_a_streamed_call_is_tool_call_deltas(user, calling):
    result = chat(user, tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                  stream=True, stream_options={"include_usage": True})
    frames = parse_sse(result.text)
    assert frames[-1]["data"] == "[DONE]"
    chunks = [f["data"] for f in frames]
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1] if c["choices"]]
    opened = [d["tool_calls"][0] for d in deltas if "tool_calls" in d and "id" in d["tool_calls"][0]]
    assert len(opened) == 1 and opened[0]["index"] == 0 and opened[0]["type"] == "function"
    assert opened[0]["function"] == {"name": "get_weather", "arguments": ""}
    pieces = [d["tool_calls"][0] for d in deltas if "tool_calls" in d and "id" not in d["tool_calls"][0]]
    assert all(p["index"] == 0 for p in pieces)
    assert "".join(p["function"]["arguments"] for p in pieces) == '{"city": "Paris"}'
    assert not any(d.get("content") for d in deltas)
    finishes = [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"]]
    assert finishes[-1] == "tool_calls" and chunks[-2]["usage"]["completion_tokens"] == 4


def test_text_with_tools_is_content(user):
    body = chat(user, tools=[TOOL]).json
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["message"]["content"] and "tool_calls" not in body["choices"][0]["message"]


def test_tools_and_format_are_kept_as_the_responses_api_keeps_them(user, store):
    body = chat(user, tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                parallel_tool_calls=False, store=True,
                response_format={"type": "json_schema", "json_schema": {"name": "out", "schema": SCHEMA,
                                                                        "strict": True}}).json
    request = store.get_request(body["id"])
    assert request["tools"] == [{"type": "function", "name": "get_weather", "description": "The weather.",
                                 "parameters": PARAMETERS, "strict": True}]
    assert request["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert request["parallel_tool_calls"] is False
    assert request["text"]["format"] == {"type": "json_schema", "name": "out", "description": None,
                                         "schema": SCHEMA, "strict": True}
    plain = store.get_request(chat(user, store=True, response_format={"type": "json_object"}).json["id"])
    assert plain["text"]["format"] == {"type": "json_object"}
    assert (plain["tools"], plain["tool_choice"], plain["parallel_tool_calls"]) == ([], "auto", True)


def test_calls_and_tool_messages_reach_the_model_as_call_items_do(user, scripted):
    messages = [ASK, {**ASSISTANT_CALL, "content": "Let me look."}, TOOL_REPLY]
    assert chat(user, messages=messages, tools=[TOOL], tool_choice="none").status_code == 200
    assert scripted.checked == [
        ASK,
        {"role": "assistant", "content": "Let me look."},
        history.call_message("get_weather", '{"city": "Paris"}', "call_1"),
        history.output_message("get_weather", "call_1", "Sunny"),
    ]


class _Config:
    max_output_tokens = 16
    max_output_tokens_cap = 64
    default_on_restart = "fail"


def test_the_prompt_describes_the_tools_as_for_a_response():
    """The runtime adds the tools to the prompt from the task's request, which keeps
    them as a Responses request does: the same system text for both APIs."""
    body = {"model": "tiny", "messages": [ASK], "tools": [TOOL], "tool_choice": "required"}
    parsed = parse_chat(body, _Config(), lambda: 1)
    same = parse_create({"model": "tiny", "input": [ASK], "tools": [{"type": "function", **TOOL["function"]}],
                         "tool_choice": "required"}, _Config(), lambda: 1)
    prompt = prompting.with_tools(parsed.messages, parsed.request)
    assert prompt == prompting.with_tools(same.messages, same.request)
    assert prompt[0]["role"] == "system" and '"get_weather"' in prompt[0]["content"]
    assert prompt[1:] == [ASK]


BAD = [
    ({"tools": [{"type": "function", "name": "f"}]}, "tools[0].name"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": "f"}, "tools"),
    ({"tools": [TOOL, TOOL]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "extra": 1}}]}, "tools[0].function.extra"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "get_weather"}}, "tool_choice.name"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}},
     "tool_choice.function.name"),
    ({"tools": [TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_object", "schema": SCHEMA}}, "response_format.schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
     "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": [1]}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, "strict": 1}}},
     "response_format.json_schema.strict"),
    ({"messages": [ASK, TOOL_REPLY]}, "messages[1].tool_call_id"),
    ({"messages": [ASK, {"role": "tool", "content": "x"}]}, "messages[1].tool_call_id"),
    ({"messages": [TOOL_REPLY, ASSISTANT_CALL]}, "messages[0].tool_call_id"),
    ({"messages": [ASK, {"role": "tool", "tool_call_id": "call_1"}]}, "messages[1].content"),
    ({"messages": [ASK, {**TOOL_REPLY, "name": "x"}]}, "messages[1].name"),
    ({"messages": [{**ASSISTANT_CALL, "tool_calls": "x"}]}, "messages[0].tool_calls"),
    ({"messages": [{**ASSISTANT_CALL, "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "{}"}}]}]}, "messages[0].tool_calls[0].id"),
    ({"messages": [{**ASSISTANT_CALL, "tool_calls": [{"id": "c", "function": {
        "name": "f", "arguments": {}}}]}]}, "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{**ASSISTANT_CALL, "tool_calls": [{"id": "c", "function": {
        "name": "a b", "arguments": "{}"}}]}]}, "messages[0].tool_calls[0].function.name"),
    ({"messages": [{"role": "assistant", "content": None}]}, "messages[0].content"),
    ({"messages": [ASK, {**ASSISTANT_CALL, "tool_calls": ASSISTANT_CALL["tool_calls"] * 2}]},
     "messages[1].tool_calls[1].id"),
    ({"messages": [ASK, ASSISTANT_CALL, TOOL_REPLY, ASSISTANT_CALL]}, "messages[3].tool_calls[0].id"),
    ({"messages": [ASK, {**ASSISTANT_CALL, "tool_calls": [{"id": "c", "function": {
        "name": "f", "arguments": "{city: Paris"}}]}]}, "messages[1].tool_calls[0].function.arguments"),
    ({"messages": [ASK, {**ASSISTANT_CALL, "tool_calls": [{"id": "c", "function": {
        "name": "f", "arguments": ""}}]}]}, "messages[1].tool_calls[0].function.arguments"),
    ({"messages": [ASK, {**ASSISTANT_CALL, "tool_calls": [{"id": "c", "function": {
        "name": "f", "arguments": '{"x": NaN}'}}]}]}, "messages[1].tool_calls[0].function.arguments"),
    ({"tools": [{"type": "function", "function": {"name": "f", "type": "function"}}]}, "tools[0].function.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, "type": "x"}}},
     "response_format.json_schema.type"),
    ({"functions": [{"name": "f"}]}, "functions"),
]


@pytest.mark.parametrize("fields,param", BAD)
def test_bad_tool_and_format_fields_are_400_with_their_param(user, fields, param):
    before = user.get("/v1/chat/completions").json["data"]
    assert_error(chat(user, store=True, **fields), 400, "invalid_request", param=param)
    assert user.get("/v1/chat/completions").json["data"] == before


@pytest.mark.parametrize("fields", [
    {"tools": [TOOL], "tool_choice": "none", "response_format": {"type": "text"}},
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}},
])
def test_logprobs_are_kept_with_or_without_a_grammar(user, fields):
    result = chat(user, logprobs=True, top_logprobs=2, **fields)
    assert result.status_code == 200
    content = result.json["choices"][0]["logprobs"]["content"]
    assert content and all(len(e["top_logprobs"]) == 2 for e in content)


def test_a_call_s_tokens_are_not_in_the_content_s_logprobs(user, calling):
    body = chat(user, tools=[TOOL], tool_choice="required", logprobs=True, top_logprobs=1).json
    [choice] = body["choices"]
    assert choice["message"]["tool_calls"] and choice["logprobs"] == {"content": [], "refusal": None}


@pytest.mark.parametrize(
    "given,named",
    [
        ("text.format.schema", "response_format.json_schema.schema"),
        ("text.format.schema.properties.a.maxLength", "response_format.json_schema.schema.properties.a.maxLength"),
        ("text.format.schema.anyOf[1]", "response_format.json_schema.schema.anyOf[1]"),
        ("tools[2].parameters", "tools[2].function.parameters"),
        ("tools[2].parameters.properties.a.enum[0]", "tools[2].function.parameters.properties.a.enum[0]"),
        ("text.format.schemata", "text.format.schemata"),
        ("tools", "tools"),
        ("model", "model"),
    ],
)
def test_the_runtimes_schema_refusals_are_named_as_the_chat_request_names_them(given, named):
    exc = chat_param(InvalidRequest(f"'{given}' is not supported: x", param=given))
    assert exc.param == named and exc.message == f"'{named}' is not supported: x" and exc.status == 400


def test_the_call_ids_of_an_answer_close_the_tool_loop(user, calling):
    first = chat(user, tools=[TOOL], tool_choice="required").json
    message = first["choices"][0]["message"]
    call = message["tool_calls"][0]
    history = [ASK, message, {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"sky": "clear"})}]
    again = chat(user, messages=history, tools=[TOOL], tool_choice="required")
    assert again.status_code == 200, again.text


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**40, max_value=2**40) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10)
names = st.sampled_from(["get_weather", "a b", "", "call_1", "type", "function", "name"])
functions = st.fixed_dictionaries({}, optional={"name": names | json_values, "parameters": json_values,
                                                "arguments": json_values, "description": json_values})
tool_shapes = st.fixed_dictionaries({}, optional={"type": st.sampled_from(["function", "x"]) | json_values,
                                                  "function": functions | json_values, "id": names | json_values})
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system"])},
    optional={"content": st.none() | st.text(max_size=8) | json_values,
              "tool_calls": st.lists(tool_shapes, max_size=2) | json_values,
              "tool_call_id": names | json_values})
fields = st.fixed_dictionaries({}, optional={
    "messages": st.lists(messages, min_size=1, max_size=3),
    "tools": st.lists(tool_shapes, max_size=2) | json_values,
    "tool_choice": st.sampled_from(["auto", "none", "required"]) | tool_shapes | json_values,
    "response_format": st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["text", "json_object", "json_schema"]) | json_values,
        "json_schema": st.fixed_dictionaries({}, optional={"name": names | json_values, "schema": json_values,
                                                           "strict": json_values}) | json_values}) | json_values,
    "logprobs": st.booleans(), "parallel_tool_calls": json_values})


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=fields)
def test_tool_fields_of_any_shape_get_an_answer_or_a_4xx(user, scripted, body):
    result = chat(user, **body)
    assert result.status_code < 500, result.text
    if result.status_code >= 400:
        assert result.json["error"]["code"] and result.json["error"]["message"]
