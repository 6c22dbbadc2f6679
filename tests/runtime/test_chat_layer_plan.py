"""What the chat layer makes of a request as the API keeps it: a resent history
with calls and their outputs reaches the template as an assistant's tool calls
and tool messages; a model whose template knows no tools keeps the service's
own call format; reasoning.effort is the thinking switch."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lmsp.wire.responses import parse_create
from lmsp.native import Engine
from lmsp.runtime import chat_layer
from lmsp.runtime import prompt as prompting

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chat_templates import THINK_TEMPLATE, TOOLS_TEMPLATE, template_engine  # noqa: E402

WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip


class _Config:
    max_output_tokens = 16
    max_output_tokens_cap = 64
    default_on_restart = "fail"


def kept(**body) -> dict:
    """The request as the API checks and keeps it."""
    return parse_create({"model": "m", **body}, _Config(), lambda: 1).request


@pytest.fixture(scope="module")
def think_engine(tmp_path_factory):
    yield from template_engine(tmp_path_factory, THINK_TEMPLATE)




def text_of(engine: Engine, tokens: list[int]) -> str:
    return b"".join(engine.token_bytes(t) for t in tokens).decode()


def test_a_resent_history_reaches_the_template_as_calls(tools_engine):
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}', "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]  # fmt: skip
    request = kept(input=history, tools=[WEATHER], instructions="Be brief.")
    messages = chat_layer.chat_messages(request)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    prompt = text_of(tools_engine, prompting.prompt_tokens(tools_engine, request, 16))
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt and "Be brief." in prompt
    assert "Result of" not in prompt  # not the service's own call format


def test_the_grammar_and_stops_are_the_chat_layers(tools_engine):
    request = kept(input="Weather?", tools=[WEATHER], tool_choice="auto")
    sampling = prompting.sampling(request, _Config(), tools_engine)
    assert sampling["grammar"]["lazy"] and sampling["grammar"]["triggers"][0]["value"] == "<tool_call>\n"
    assert prompting.sampling(request, _Config())["grammar"]["triggers"] != sampling["grammar"]["triggers"]


def test_a_template_without_tools_keeps_the_services_format(plain_engine):
    request = kept(input="Weather?", tools=[WEATHER], tool_choice="required")
    assert chat_layer.plan(plain_engine, request) is None  # the demo model's ChatML knows no tools
    prompt = text_of(plain_engine, prompting.prompt_tokens(plain_engine, request, 16))
    assert "You can call these functions" in prompt


def test_effort_is_the_thinking_switch(think_engine):
    def prompt(**body) -> str:
        return text_of(think_engine, prompting.prompt_tokens(think_engine, kept(input="Hi", **body), 16))

    off, on, default = prompt(reasoning={"effort": "none"}), prompt(reasoning={"effort": "low"}), prompt()
    assert off.endswith("<think>\n\n</think>\n\n") and on.endswith("<think>\n") and default == on
    assert kept(input="Hi", reasoning={"effort": "low"})["reasoning"] == {"effort": "low", "summary": None}


def test_a_named_tool_is_the_only_one_rendered_and_called(tools_engine):
    other = {**WEATHER, "name": "get_time"}
    request = kept(input="Weather?", tools=[WEATHER, other], tool_choice={"type": "function", "name": "get_time"})
    found = chat_layer.plan(tools_engine, request)
    assert found is not None and not found.grammar["lazy"]
    assert '"get_time"' in found.grammar["gbnf"] and '"get_weather"' not in found.grammar["gbnf"]
    assert "get_weather" not in text_of(tools_engine, found.tokens)


def test_plans_are_kept_per_engine(tools_engine, plain_engine, tmp_path_factory):
    request = kept(input="Weather?", tools=[WEATHER], tool_choice="required")
    first = chat_layer.plan(tools_engine, request)
    assert chat_layer.plan(tools_engine, request) is first  # rendered once
    assert chat_layer.plan(tools_engine, kept(input="Weather?", tools=[WEATHER])) is not first
    for other in template_engine(tmp_path_factory, TOOLS_TEMPLATE):  # the same file's template, another engine
        again = chat_layer.plan(other, request)
        assert again is not first and again.tokens == first.tokens


def test_a_chat_layer_task_computes_log_probabilities(think_engine):
    request = kept(input="Hi", include=["message.output_text.logprobs"], top_logprobs=2)
    assert prompting.sampling(request, _Config(), think_engine)["logprobs"] is True
    assert prompting.sampling(request, _Config(), think_engine)["top_logprobs"] == 2


def test_the_earlier_turns_a_request_continues_come_before_its_input():
    request = {"instructions": "Be brief.", "context": [{"role": "user", "content": "Hi"},
                                                        {"role": "assistant", "content": "Hello."}],
               "input": "Weather?"}  # fmt: skip
    roles = [(m["role"], m["content"]) for m in chat_layer.chat_messages(request)]
    assert roles == [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello."), ("user", "Weather?")]


def test_max_tool_calls_bounds_the_calls(tools_engine):
    def rule(**body) -> str:
        found = chat_layer.plan(tools_engine, kept(input="Weather?", tools=[WEATHER], tool_choice="required", **body))
        return next(line for line in found.grammar["gbnf"].splitlines() if line.startswith("tool-calls ::="))

    assert rule() == "tool-calls ::= (tool-call space)+"
    assert rule(max_tool_calls=3) == "tool-calls ::= (tool-call space){1,3}"
    assert rule(parallel_tool_calls=False, max_tool_calls=3) == "tool-calls ::= (tool-call space)"
