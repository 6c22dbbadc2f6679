"""The chat layer's shaper on fixed outputs read by llama.cpp's parser: the
events of a call's arguments and of reasoning as they grow, and a shaper made
from the committed text continuing exactly where the first one was."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterator

import pytest

from lmsp.items import chat as ci
from lmsp.models.demo import write_demo_model
from lmsp.native import ChatParser, Engine
from lmsp.runtime.chat_shaper import ChatShaper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chat_templates import THINK_TEMPLATE, THINK_TOOLS_TEMPLATE, TOOLS_TEMPLATE  # noqa: E402

ITEM_ID = "msg_abc"
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THOUGHT = "Paris is in France.\n</think>\n\nIt is sunny."


def _parse(tmp_path_factory, template: str, **render) -> Iterator:
    path = write_demo_model(tmp_path_factory.mktemp("m") / "m.gguf", chat_template=template)
    e = Engine(str(path), n_ctx=256, n_parallel=1, n_threads=1)
    r = e.chat_template().render(json.dumps([{"role": "user", "content": "Weather?"}]), **render)
    e.close()
    yield ChatParser(r["format"], r["generation_prompt"], r["parser"]).parse


@pytest.fixture(scope="module")
def tools_parse(tmp_path_factory):
    yield from _parse(tmp_path_factory, TOOLS_TEMPLATE, tools=json.dumps([TOOL]))


@pytest.fixture(scope="module")
def think_parse(tmp_path_factory):
    yield from _parse(tmp_path_factory, THINK_TEMPLATE)


@pytest.fixture(scope="module")
def think_tools_parse(tmp_path_factory):
    yield from _parse(tmp_path_factory, THINK_TOOLS_TEMPLATE, tools=json.dumps([TOOL]), tool_choice="required")


def run(shaper: ChatShaper, text: str, step: int = 3, final: bool = True) -> list[tuple]:
    rows = []
    for i in range(0, len(text), step):
        last = final and i + step >= len(text)
        assert shaper.push(text[i : i + step], last)["delta"] == ""  # the committer's merge adds nothing
        rows += shaper.made()
    return rows


def events(rows: list[tuple]) -> list[tuple[str, dict]]:
    return [(etype, payload) for etype, _, payload in rows]


def test_a_call_opens_then_its_arguments_grow(tools_parse) -> None:
    rows = run(ChatShaper(tools_parse, ITEM_ID), CALL)
    types = [etype for etype, _ in events(rows)]
    assert types[0] == ci.ADDED and set(types[1:]) == {ci.ARGS_DELTA} and len(types) > 3
    item = rows[0][2]["item"]
    assert item == {"type": "function_call", "id": "fc_abc", "call_id": "call_abc", "name": "get_weather",
                    "arguments": "", "status": "in_progress"}  # fmt: skip
    args = "".join(p["delta"] for _, p in events(rows)[1:])
    assert json.loads(args) == {"city": "Paris"}
    assert CALL.startswith("".join(raw for _, raw, _ in rows if raw is not None))
    ends = ci.closing_events(item, 0, args, "completed")
    assert [e for e, _ in ends] == [ci.ARGS_DONE, ci.ITEM_DONE] and ends[1][1]["item"]["arguments"] == args


def test_text_is_a_message(tools_parse) -> None:
    rows = run(ChatShaper(tools_parse, ITEM_ID), "It is sunny in Paris.")
    types = [etype for etype, _ in events(rows)]
    assert types[:2] == [ci.ADDED, ci.PART_ADDED] and set(types[2:]) == {ci.TEXT_DELTA}
    assert "".join(p["delta"] for _, p in events(rows)[2:]) == "It is sunny in Paris."
    assert rows[0][2]["item"]["id"] == ITEM_ID


def test_reasoning_then_the_answer(think_parse) -> None:
    rows = run(ChatShaper(think_parse, ITEM_ID), THOUGHT)
    evs = events(rows)
    types = [etype for etype, _ in evs]
    first_text = types.index(ci.ITEM_DONE)
    assert types[0] == ci.ADDED and evs[0][1]["item"]["type"] == "reasoning"
    assert set(types[1 : first_text - 1]) == {ci.REASONING_DELTA} and types[first_text - 1] == ci.REASONING_DONE
    reasoning = "".join(p["delta"] for t, p in evs if t == ci.REASONING_DELTA)
    assert reasoning.strip() == "Paris is in France."
    assert evs[first_text][1]["item"]["content"] == [{"type": "reasoning_text", "text": reasoning}]
    assert types[first_text + 1 : first_text + 3] == [ci.ADDED, ci.PART_ADDED]
    message = evs[first_text + 1][1]
    assert message["output_index"] == 1 and message["item"]["id"] == ITEM_ID
    assert "".join(p["delta"] for t, p in evs if t == ci.TEXT_DELTA) == "It is sunny."
    assert evs[0][1]["item"]["id"] == "rs_abc"
    items = ci.fold([(t, json.dumps(p)) for t, p in evs], "completed")
    assert [i["type"] for i in items] == ["reasoning", "message"]
    assert items[1]["content"][0]["text"] == "It is sunny."


def test_reasoning_then_a_call(think_tools_parse) -> None:
    evs = events(run(ChatShaper(think_tools_parse, ITEM_ID), "The weather tool.\n</think>\n\n" + CALL))
    added = [p["item"] for t, p in evs if t == ci.ADDED]
    assert [(i["type"], i["id"]) for i in added] == [("reasoning", "rs_abc"), ("function_call", "fc_abc")]
    assert [p["output_index"] for t, p in evs if t == ci.ARGS_DELTA] == [1] * sum(t == ci.ARGS_DELTA for t, _ in evs)
    assert json.loads("".join(p["delta"] for t, p in evs if t == ci.ARGS_DELTA)) == {"city": "Paris"}


@pytest.mark.parametrize("which", ["call", "thought", "thought_and_call"])
def test_a_shaper_made_from_the_committed_text_continues_exactly(
    tools_parse, think_parse, think_tools_parse, which
) -> None:
    parse, text = {
        "call": (tools_parse, CALL),
        "thought": (think_parse, THOUGHT),
        "thought_and_call": (think_tools_parse, "Tools.\n</think>\n\n" + CALL),
    }[which]
    whole = events(run(ChatShaper(parse, ITEM_ID), text, step=1))
    for cut in range(1, len(text)):
        first = ChatShaper(parse, ITEM_ID)
        before = run(first, text[:cut], step=1, final=False)
        committed = "".join(raw for _, raw, _ in before if raw is not None)
        assert text.startswith(committed)
        again = ChatShaper(parse, ITEM_ID, committed)
        after = run(again, text[len(committed) :], step=1)
        assert events(before) + events(after) == whole, cut


def test_text_then_a_call_makes_two_items(tools_parse) -> None:
    evs = events(run(ChatShaper(tools_parse, ITEM_ID), "Let me check.\n" + CALL, step=1))
    added = [(p["output_index"], p["item"]["type"]) for t, p in evs if t == ci.ADDED]
    assert added == [(0, "message"), (1, "function_call")]
    text = "".join(p["delta"] for t, p in evs if t == ci.TEXT_DELTA)
    assert text == "Let me check.\n"  # never a piece of the call's marker
    assert [t for t, _ in evs].index(ci.ITEM_DONE) < [t for t, _ in evs].index(ci.ARGS_DELTA)


def test_an_output_cut_inside_a_call_keeps_its_items() -> None:
    def parse(text: str, partial: bool) -> dict:  # a parser that refuses a whole output cut short
        if not partial:
            raise ValueError("the output does not match the chat format")
        return {"content": "", "reasoning": "", "tool_calls": [{"name": "f", "arguments": text[4:], "id": ""}]}

    rows = run(ChatShaper(parse, ITEM_ID), 'xxxx{"a": 1', step=4)
    assert [t for t, _ in events(rows)] == [ci.ADDED, ci.ARGS_DELTA, ci.ARGS_DELTA]
    assert "".join(p["delta"] for t, p in events(rows) if t == ci.ARGS_DELTA) == '{"a": 1'


def test_a_call_cut_inside_its_name_makes_no_item() -> None:
    def parse(text: str, partial: bool) -> dict:  # a reading that shows a name cut short
        return {"content": "", "reasoning": "", "tool_calls": [{"name": text, "arguments": "", "id": ""}]}

    assert events(run(ChatShaper(parse, ITEM_ID), "get_wea")) == []
