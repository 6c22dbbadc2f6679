"""llama.cpp's chat layer through the module: a template that knows tools
rendered with them (prompt, grammar, triggers, preserved tokens, parser), a
thinking template and its switch, and the parser on fixed outputs."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterator

import pytest
from native_helpers import drain

from lmsp.models.demo import write_demo_model
from lmsp.native import ChatParser, Engine
from lmsp.runtime.chat_layer import require_call, single_call

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chat_templates import THINK_TEMPLATE, TOOLS_TEMPLATE  # noqa: E402

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Rome"]},  # bounded: a random model fills a free string for ever
                "days": {"type": "integer", "minimum": 1, "maximum": 9},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
ASK = json.dumps([{"role": "user", "content": "Weather in Paris?"}])


def _engine(tmp_path_factory: pytest.TempPathFactory, name: str, template: str | None) -> Iterator[Engine]:
    path = write_demo_model(tmp_path_factory.mktemp(name) / f"{name}.gguf", chat_template=template)
    e = Engine(str(path), n_ctx=1024, n_parallel=2, n_threads=1)
    yield e
    e.close()


@pytest.fixture(scope="module")
def tools_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    yield from _engine(tmp_path_factory, "tools", TOOLS_TEMPLATE)


@pytest.fixture(scope="module")
def think_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    yield from _engine(tmp_path_factory, "think", THINK_TEMPLATE)


def test_the_capabilities_say_which_template_knows_tools(tools_engine: Engine, engine: Engine) -> None:
    caps = tools_engine.chat_template().caps
    assert caps["supports_tools"] and caps["supports_tool_calls"]
    plain = engine.chat_template().caps  # the demo model's ChatML renders no tools
    assert not (plain["supports_tools"] and plain["supports_tool_calls"])
    assert not tools_engine.chat_template().supports_thinking


def test_a_model_without_a_template_has_none(tmp_path_factory: pytest.TempPathFactory) -> None:
    for e in _engine(tmp_path_factory, "bare", None):
        assert e.chat_template() is None


def test_auto_renders_the_tools_with_a_lazy_grammar(tools_engine: Engine) -> None:
    r = tools_engine.chat_template().render(ASK, tools=json.dumps([WEATHER]), tool_choice="auto")
    assert '"name": "get_weather"' in r["prompt"] and r["prompt"].endswith("<|im_start|>assistant\n")
    assert r["generation_prompt"] == "<|im_start|>assistant\n"
    grammar = r["grammar"]
    assert grammar["lazy"] and grammar["triggers"] == [{"type": "word", "value": "<tool_call>\n"}]
    assert grammar["preserved"] == ["<tool_call>", "</tool_call>"]
    assert r["format_name"] == "peg-native" and r["parser"]


def test_required_without_free_text_makes_the_output_a_call(tools_engine: Engine) -> None:
    r = tools_engine.chat_template().render(ASK, tools=json.dumps([WEATHER]), tool_choice="required")
    assert not r["grammar"]["lazy"] and r["grammar"]["prefill"] == r["generation_prompt"]
    parser = ChatParser(r["format"], r["generation_prompt"], r["parser"])
    prompt = tools_engine.tokenize(r["prompt"], add_special=True, parse_special=True)
    for seed in (1, 2, 3):
        grammar = require_call(r["grammar"])
        seq = tools_engine.submit(prompt, max_tokens=200, temperature=1.0, seed=seed, grammar=grammar)
        run = drain(tools_engine, [seq])[seq]
        assert run.finish == "stop", run.text
        calls = parser.parse(run.text, False)["tool_calls"]
        # one call or more: the chat layer's grammar lets parallel calls follow the first
        assert calls and {c["name"] for c in calls} == {"get_weather"}, run.text
        for call in calls:
            args = json.loads(call["arguments"])
            assert set(args) == {"city", "days"} and isinstance(args["days"], int)


def test_the_chat_layers_required_grammar_allows_text_before_the_call(tools_engine: Engine) -> None:
    gbnf = tools_engine.chat_template().render(ASK, tools=json.dumps([WEATHER]), tool_choice="required")["grammar"]
    root = next(line for line in gbnf["gbnf"].splitlines() if line.startswith("root ::="))
    assert "until-" in root  # what require_call takes out
    kept = next(line for line in require_call(gbnf)["gbnf"].splitlines() if line.startswith("root ::="))
    assert "until-" not in kept and kept.endswith("tool-calls")


def test_one_call_only_without_parallel_calls(tools_engine: Engine) -> None:
    t = tools_engine.chat_template()
    r = t.render(ASK, tools=json.dumps([WEATHER]), tool_choice="required", parallel_tool_calls=False)
    rule = next(line for line in r["grammar"]["gbnf"].splitlines() if line.startswith("tool-calls ::="))
    assert rule == "tool-calls ::= (tool-call space)+"  # the chat layer's, whatever parallel_tool_calls says
    grammar = single_call(require_call(r["grammar"]))
    assert "tool-calls ::= (tool-call space)" in grammar["gbnf"].splitlines()
    parser = ChatParser(r["format"], r["generation_prompt"], r["parser"])
    prompt = tools_engine.tokenize(r["prompt"], add_special=True, parse_special=True)
    for seed in (1, 2, 3, 4):
        seq = tools_engine.submit(prompt, max_tokens=200, temperature=1.0, seed=seed, grammar=grammar)
        run = drain(tools_engine, [seq])[seq]
        assert run.finish == "stop" and len(parser.parse(run.text, False)["tool_calls"]) == 1, run.text


def test_at_most_max_tool_calls(tools_engine: Engine) -> None:
    t = tools_engine.chat_template()
    # as the runtime renders a bound: blocks of one call each, at most so many blocks
    r = t.render(ASK, tools=json.dumps([WEATHER]), tool_choice="required", parallel_tool_calls=False)
    grammar = single_call(require_call(r["grammar"]), 2)
    assert "tool-calls ::= (tool-call space){1,2}" in grammar["gbnf"].splitlines()
    parser = ChatParser(r["format"], r["generation_prompt"], r["parser"])
    prompt = tools_engine.tokenize(r["prompt"], add_special=True, parse_special=True)
    counts = set()
    for seed in range(1, 9):
        seq = tools_engine.submit(prompt, max_tokens=300, temperature=1.0, seed=seed, grammar=grammar)
        run = drain(tools_engine, [seq])[seq]
        assert run.finish == "stop", run.text
        counts.add(len(parser.parse(run.text, False)["tool_calls"]))
    assert counts <= {1, 2}


def test_none_and_no_tools_make_no_grammar(tools_engine: Engine) -> None:
    t = tools_engine.chat_template()
    assert t.render(ASK, tools=json.dumps([WEATHER]), tool_choice="none")["grammar"] is None
    assert t.render(ASK)["grammar"] is None


def test_a_schema_gives_a_grammar_that_is_not_lazy(tools_engine: Engine) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = tools_engine.chat_template().render(ASK, json_schema=json.dumps(schema))
    assert r["grammar"] is not None and not r["grammar"]["lazy"]


def test_history_with_calls_and_their_outputs_renders(tools_engine: Engine) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]  # fmt: skip
    prompt = tools_engine.chat_template().render(json.dumps(messages), tools=json.dumps([WEATHER]))["prompt"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt


def test_bad_input_is_a_value_error(tools_engine: Engine) -> None:
    t = tools_engine.chat_template()
    with pytest.raises(ValueError, match="tool_choice"):
        t.render(ASK, tool_choice="always")
    with pytest.raises(ValueError, match="cannot be read"):
        t.render("not json")
    with pytest.raises(ValueError, match="cannot be read"):
        t.render(ASK, tools='[{"type": "function"}]')
    with pytest.raises(ValueError, match="parser"):
        ChatParser(2, "", "not a parser")


def _parser(engine: Engine, **kwargs) -> ChatParser:
    r = engine.chat_template().render(ASK, **kwargs)
    return ChatParser(r["format"], r["generation_prompt"], r["parser"])


def test_the_parser_reads_calls_as_they_grow(tools_engine: Engine) -> None:
    parser = _parser(tools_engine, tools=json.dumps([WEATHER]))
    whole = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    done = parser.parse(whole, False)
    assert done == {"content": "", "reasoning": "",
                    "tool_calls": [{"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}', "id": ""}]}
    seen = ""
    for end in range(len("<tool_call>\n"), len(whole) + 1):
        calls = parser.parse(whole[:end], True)["tool_calls"]
        if calls and calls[0]["arguments"]:
            assert calls[0]["arguments"].startswith(seen)  # arguments only grow
            seen = calls[0]["arguments"]
    assert seen == '{"city": "Paris", "days": 2}'
    assert parser.parse("It is sunny.", False) == {"content": "It is sunny.", "reasoning": "", "tool_calls": []}


def test_two_calls_in_a_row(tools_engine: Engine) -> None:
    parser = _parser(tools_engine, tools=json.dumps([WEATHER]), parallel_tool_calls=True)
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s", "days": 1}}\n</tool_call>'
    calls = parser.parse(one % "Paris" + "\n" + one % "Rome", False)["tool_calls"]
    assert [json.loads(c["arguments"])["city"] for c in calls] == ["Paris", "Rome"]


def test_thinking_is_read_as_reasoning(think_engine: Engine) -> None:
    t = think_engine.chat_template()
    assert t.supports_thinking
    r = t.render(ASK)
    assert r["supports_thinking"] and r["thinking_start"] == "<think>" and r["thinking_end"] == ["</think>"]
    assert r["generation_prompt"].endswith("<think>\n")  # the answer opens inside the thinking
    parser = ChatParser(r["format"], r["generation_prompt"], r["parser"])
    assert parser.parse("hmm, let me", True) == {"content": "", "reasoning": "hmm, let me", "tool_calls": []}
    done = parser.parse("clouds\n</think>\n\nIt is grey.", False)
    assert done["content"] == "It is grey." and done["reasoning"].strip() == "clouds"


def test_the_thinking_switch_is_the_templates(think_engine: Engine) -> None:
    t = think_engine.chat_template()
    off = t.render(ASK, enable_thinking=False)
    on = t.render(ASK, enable_thinking=True)["prompt"]
    assert off["prompt"].endswith("<think>\n\n</think>\n\n") and on.endswith("<|im_start|>assistant\n<think>\n")
    assert t.render(ASK)["prompt"] == on  # as llama-server: on where the template has it
    parser = ChatParser(off["format"], off["generation_prompt"], off["parser"])
    assert parser.parse("It is grey.", False)["content"] == "It is grey."


def test_a_template_that_reads_the_effort_gets_it(tmp_path_factory: pytest.TempPathFactory) -> None:
    template = THINK_TEMPLATE.replace(
        "{% for message in messages %}",
        "{% if reasoning_effort is defined %}<|im_start|>system\neffort={{ reasoning_effort }}<|im_end|>\n"
        "{% endif %}{% for message in messages %}",
        1,
    )
    for e in _engine(tmp_path_factory, "effort", template):
        t = e.chat_template()
        assert "effort=high" in t.render(ASK, reasoning_effort="high")["prompt"]
        assert "effort=" not in t.render(ASK)["prompt"]
