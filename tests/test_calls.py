"""The service's own function-call format (lmsp.calls) and the split of an output
into text or calls as it comes (lmsp.runtime.calls.CallShaper): one call, or
several one per line where the request allows parallel calls."""
from __future__ import annotations

import pytest

from lmsp import calls
from lmsp.runtime.calls import CallShaper

CALL = '  {"name": "get_weather", "arguments": {"city": "Paris", "tags": {"a": "}"}}}'
ARGS = '{"city": "Paris", "tags": {"a": "}"}}'
SECOND = '\n{"name": "get_time", "arguments": {"zone": "CET [\\"x\\"]"} }\n'
TWO = CALL + SECOND


def shaped(shaper: CallShaper, pieces: list[str]) -> list[dict]:
    out = [shaper.push(p, False) for p in pieces]
    return out + [shaper.push("", True)]


def segments(out: list[dict]) -> list[dict]:
    return [s for o in out for s in o.get("calls", ())]


def text_of(out: list[dict]) -> str:
    """The output's text as the store keeps it: each segment's head, arguments and tails."""
    return "".join(o.get("delta", "") + "".join(s.get("call", {}).get("head", "") + s["args"]
                                                 + s.get("done", {}).get("tail", "") + s.get("tail", "")
                                                 for s in o.get("calls", ())) for o in out)


def args_of(out: list[dict], index: int) -> str:
    return "".join(s["args"] for s in segments(out) if s["index"] == index)


def joined(out: list[dict], key: str) -> str:
    return "".join(o.get(key, "") for o in out)


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(CALL)])
def test_a_call_comes_out_as_its_head_its_arguments_and_its_tail(size):
    pieces = [CALL[i:i + size] for i in range(0, len(CALL), size)]
    for mode in ("auto", "required"):
        out = shaped(CallShaper(mode), pieces)
        [opened] = [s["call"] for s in segments(out) if "call" in s]
        assert opened == {"name": "get_weather", "head": '  {"name": "get_weather", "arguments": '}
        assert args_of(out, 0) == ARGS
        assert segments(out)[-1]["tail"] == "}" and not any("done" in s for s in segments(out))
        assert joined(out, "delta") == ""
        assert text_of(out) == CALL  # the output's text, whole


@pytest.mark.parametrize("size", [1, 2, 5, len(TWO)])
def test_calls_one_per_line_each_open_and_done_in_turn(size):
    out = shaped(CallShaper("required"), [TWO[i:i + size] for i in range(0, len(TWO), size)])
    made = segments(out)
    assert [s["call"]["name"] for s in made if "call" in s] == ["get_weather", "get_time"]
    assert [s["index"] for s in made] == sorted(s["index"] for s in made)  # in order
    [done] = [s["done"] for s in made if "done" in s]
    assert done == {"tail": "}", "name": "get_weather", "arguments": ARGS} and done is not made[-1].get("done")
    assert (args_of(out, 0), args_of(out, 1)) == (ARGS, '{"zone": "CET [\\"x\\"]"}')
    assert made[-1]["index"] == 1 and made[-1]["tail"] == " }\n"
    assert text_of(out) == TWO
    assert calls.split_all(TWO) == [("get_weather", ARGS), ("get_time", '{"zone": "CET [\\"x\\"]"}')]


def test_text_and_json_that_is_not_a_call_are_text():
    for text in (" Hello {there}", '{"name": "Ada", "age": 3}', '{"title": "x"}'):
        pieces = [text[i:i + 2] for i in range(0, len(text), 2)]
        out = shaped(CallShaper("auto"), pieces)
        assert joined(out, "delta") == text and not segments(out)


@pytest.mark.parametrize("output", [CALL, TWO])
def test_a_shaper_made_from_committed_text_continues_exactly(output):
    whole = shaped(CallShaper("auto"), [output[i:i + 3] for i in range(0, len(output), 3)])
    for cut in range(len(output)):
        first = CallShaper("auto")
        committed = text_of([first.push(output[i:min(i + 3, cut)], False) for i in range(0, cut, 3)])
        # the engine gives again what was not committed
        rest = shaped(CallShaper("auto", committed), [output[len(committed):]])
        assert committed + text_of(rest) == output
        before = len(calls.split_all(committed))  # calls opened already: the rest goes on from the last
        assert segments(rest)[0]["index"] == max(before - 1, 0)
        assert all(s["index"] >= before for s in segments(rest) if "call" in s)
    assert [args_of(whole, i) for i in range(len(calls.split_all(output)))] == [a for _, a in
                                                                                calls.split_all(output)]


def test_split_ids_and_mode():
    assert calls.split(CALL) == ("get_weather", ARGS)
    assert calls.split('{"name": "f", "arguments": {"a": 1') == ("f", '{"a": 1')
    assert calls.split_all('{"name": "f", "arguments": {"a": 1}}\n{"name": "g", "argu') == [("f", '{"a": 1}')]
    assert calls.split("plain text") is None
    assert calls.ids("msg_01ABC") == ("fc_01ABC", "call_01ABC")
    assert calls.ids("msg_01ABC", 2) == ("fc_01ABC_2", "call_01ABC_2")
    assert calls.mode({"tools": [{"name": "f"}]}) == "auto"
    assert calls.mode({"tools": [{"name": "f"}], "tool_choice": "none"}) is None
    assert calls.mode({"tools": [{"name": "f"}], "tool_choice": {"type": "function", "name": "f"}}) == "required"
    assert calls.mode({"tools": []}) is None
    assert calls.most_calls({}) is None and calls.most_calls({"parallel_tool_calls": False}) == 1
    assert calls.most_calls({"parallel_tool_calls": True, "max_tool_calls": 3}) == 3
