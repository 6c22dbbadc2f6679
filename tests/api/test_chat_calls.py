"""Calls on Chat Completions with the scripted worker, as OpenAI's clients read them:
the role chunk of a stream that may be a call (``content: null``, as OpenAI
sends it) through the ``openai`` package's stream accumulation, and a stored
completion's messages with their calls and tool messages in OpenAI's shape."""
from __future__ import annotations

from types import SimpleNamespace

import httpx
import openai
import pytest
from api_fakes import OWNER
from api_helpers import parse_sse

from lmsp.runtime.committer import merge
from lmsp.runtime.calls import CallShaper

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather.",
                                         "parameters": PARAMETERS}}
CALL_TEXT = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ASK = {"role": "user", "content": "Weather in Paris?"}


def chat(api, **fields):
    body = {"model": "tiny", "messages": [ASK]}
    body.update(fields)
    return api.post("/v1/chat/completions", json=body)


@pytest.fixture
def calling(scripted, store):
    """The scripted worker answers with ``scripted.call_text`` (a call by default), in
    pieces of 7 characters shaped as the committer shapes them."""
    scripted.call_text = CALL_TEXT

    def finish(task_id, text, finish="stop"):
        task = store.get_task(task_id)
        request = store.get_request(task["response_id"])
        run = SimpleNamespace(task_id=task_id, attempt=task["attempts"], engine=None,
                              calls=CallShaper.for_request(request))
        given = scripted.call_text if run.calls is not None else text
        pieces = [given[i:i + 7] for i in range(0, len(given), 7)]
        for i, piece in enumerate(pieces):
            final = i == len(pieces) - 1
            result = {"text": piece, "tokens": [i + 1], "finish": finish if final else None, "n_prompt": 3,
                      "n_generated": i + 1}
            store.append_step(OWNER, [merge(None, run, result)])  # type: ignore[arg-type]

    scripted.finish = finish
    return scripted


@pytest.fixture
def sdk(app, user):
    """The ``openai`` package, unmodified, over the app. It closes a stream once it has
    read ``[DONE]``, which the service takes for a client that left: its streams are of
    stored completions, which nothing deletes after the test."""
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://lmsp.test") as http:
        yield openai.OpenAI(base_url="http://lmsp.test/v1", api_key=user.token, http_client=http, max_retries=0)


def first_delta(result) -> dict:
    return parse_sse(result.text)[0]["data"]["choices"][0]["delta"]


def test_the_role_chunk_of_an_answer_that_may_be_a_call_has_null_content(user, calling):
    assert first_delta(chat(user, tools=[TOOL], tool_choice="required", stream=True)) == {
        "role": "assistant", "content": None, "refusal": None}
    assert first_delta(chat(user, tools=[TOOL], stream=True))["content"] is None  # auto: not known yet
    assert first_delta(chat(user, tools=[TOOL], tool_choice="none", stream=True))["content"] == ""
    assert first_delta(chat(user, stream=True))["content"] == ""


def test_the_openai_stream_accumulates_a_call_with_null_content(sdk, calling):
    with sdk.chat.completions.stream(model="tiny", messages=[ASK], tools=[TOOL], tool_choice="required",
                                     store=True) as stream:
        final = stream.get_final_completion()
    [choice] = final.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert call.function.arguments == '{"city": "Paris"}'


def test_the_openai_stream_accumulates_text_after_a_null_role_chunk(sdk, calling):
    calling.call_text = "It is sunny."
    with sdk.chat.completions.stream(model="tiny", messages=[ASK], tools=[TOOL], store=True) as stream:
        final = stream.get_final_completion()
    [choice] = final.choices
    assert choice.finish_reason == "stop" and choice.message.content == "It is sunny."
    assert not choice.message.tool_calls


def test_a_stored_completions_messages_show_calls_and_tool_messages_as_openai(user, calling):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    messages = [{"role": "system", "content": "Be brief."}, ASK,
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "Sunny"}]},
                {"role": "assistant", "content": "Let me check Paris too.", "tool_calls": [
                    {**call, "id": "call_2", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_2", "content": "Rain"}]
    made = chat(user, messages=messages, tools=[TOOL], store=True).json
    listed = user.get(f"/v1/chat/completions/{made['id']}/messages").json["data"]
    assert [m["id"] for m in listed] == [f"{made['id']}-{i}" for i in range(6)]
    shown = [{k: v for k, v in m.items() if k not in ("id", "content_parts")} for m in listed]
    assert shown == [
        {"role": "system", "content": "Be brief."},
        ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "Sunny", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "Let me check Paris too.", "tool_calls": [
            {**call, "id": "call_2", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "Rain", "tool_call_id": "call_2"},
    ]
    answer = user.get(f"/v1/chat/completions/{made['id']}").json["choices"][0]["message"]
    assert answer["content"] is None and answer["tool_calls"][0]["function"]["name"] == "get_weather"


# -- parallel calls ------------------------------------------------------------------

TWO_CALLS = CALL_TEXT + '\n{"name": "get_weather", "arguments": {"city": "Rome"}}'


def test_parallel_calls_are_tool_calls_of_their_own(user, calling):
    calling.call_text = TWO_CALLS
    body = chat(user, tools=[TOOL], tool_choice="required", store=True).json
    [choice] = body["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    made = choice["message"]["tool_calls"]
    assert [c["function"] for c in made] == [{"name": "get_weather", "arguments": '{"city": "Paris"}'},
                                             {"name": "get_weather", "arguments": '{"city": "Rome"}'}]
    assert len({c["id"] for c in made}) == 2 and all(c["id"].startswith("call_") for c in made)
    assert user.get(f"/v1/chat/completions/{body['id']}").json["choices"][0]["message"]["tool_calls"] == made
    history = [ASK, choice["message"], *({"role": "tool", "tool_call_id": c["id"], "content": "Sunny"} for c in made)]
    assert chat(user, messages=history, tools=[TOOL]).status_code == 200


def test_parallel_calls_stream_with_their_index_identical_on_replay(user, calling):
    calling.call_text = TWO_CALLS
    headers = {"Idempotency-Key": "two-calls"}
    fields = {"tools": [TOOL], "tool_choice": "required", "stream": True, "store": True}
    result = user.post("/v1/chat/completions", json={"model": "tiny", "messages": [ASK], **fields}, headers=headers)
    frames = parse_sse(result.text)
    deltas = [d for f in frames[:-1] if f["data"]["choices"] for d in f["data"]["choices"][0]["delta"].get(
        "tool_calls") or ()]
    opened = [d for d in deltas if "id" in d]
    assert [d["index"] for d in opened] == [0, 1] and opened[0]["id"] != opened[1]["id"]
    assert ["".join(d["function"]["arguments"] for d in deltas if d["index"] == i) for i in (0, 1)] == [
        '{"city": "Paris"}', '{"city": "Rome"}']
    again = user.post("/v1/chat/completions", json={"model": "tiny", "messages": [ASK], **fields}, headers=headers)
    assert parse_sse(again.text) == frames


def test_the_openai_stream_accumulates_parallel_calls(sdk, calling):
    calling.call_text = TWO_CALLS
    with sdk.chat.completions.stream(model="tiny", messages=[ASK], tools=[TOOL], tool_choice="required",
                                     store=True) as stream:
        final = stream.get_final_completion()
    made = final.choices[0].message.tool_calls
    assert [c.function.arguments for c in made] == ['{"city": "Paris"}', '{"city": "Rome"}']
    assert final.choices[0].message.content is None and made[0].id != made[1].id


def test_parallel_calls_on_responses_are_items_with_their_output_index(user, calling):
    calling.call_text = TWO_CALLS
    body = {"model": "tiny", "input": "Weather in Paris and Rome?", "tools": [{"type": "function",
                                                                             **TOOL["function"]}],
            "tool_choice": "required"}
    made = user.post("/v1/responses", json=body).json
    assert [(i["type"], i["arguments"], i["status"]) for i in made["output"]] == [
        ("function_call", '{"city": "Paris"}', "completed"), ("function_call", '{"city": "Rome"}', "completed")]
    assert len({i["id"] for i in made["output"]} | {i["call_id"] for i in made["output"]}) == 4
    events = [f["data"] for f in parse_sse(user.post("/v1/responses", json={**body, "stream": True}).text)]
    added = [e for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in added] == [e["output_index"] for e in done] == [0, 1]
    args = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert {e["item_id"] for e in args if e["output_index"] == 1} == {added[1]["item"]["id"]}
    assert events[-1]["response"]["output"] == [e["item"] for e in done]
