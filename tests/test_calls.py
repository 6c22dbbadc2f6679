"""The service's own function-call format (lmsp.calls) and the split of an output
into text or a call as it comes (lmsp.runtime.toolcalls.CallShaper)."""
from __future__ import annotations

import pytest

from lmsp import calls
from lmsp.runtime.toolcalls import CallShaper

CALL = '  {"name": "get_weather", "arguments": {"city": "Paris", "tags": {"a": "}"}}}'
ARGS = '{"city": "Paris", "tags": {"a": "}"}}'


def shaped(shaper: CallShaper, pieces: list[str]) -> list[dict]:
    out = [shaper.push(p, False) for p in pieces]
    return out + [shaper.push("", True)]


def joined(out: list[dict], key: str) -> str:
    return "".join(o.get(key, "") for o in out)


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(CALL)])
def test_a_call_comes_out_as_its_head_its_arguments_and_its_tail(size):
    pieces = [CALL[i:i + size] for i in range(0, len(CALL), size)]
    for mode in ("auto", "required"):
        out = shaped(CallShaper(mode), pieces)
        [opened] = [o["call"] for o in out if "call" in o]
        assert opened == {"name": "get_weather", "head": '  {"name": "get_weather", "arguments": '}
        assert joined(out, "args") == ARGS
        assert out[-1]["tail"] == "}"
        assert joined(out, "delta") == ""
        assert opened["head"] + joined(out, "args") + out[-1]["tail"] == CALL  # the output's text, whole


def test_text_and_json_that_is_not_a_call_are_text():
    for text in (" Hello {there}", '{"name": "Ada", "age": 3}', '{"title": "x"}'):
        pieces = [text[i:i + 2] for i in range(0, len(text), 2)]
        out = shaped(CallShaper("auto"), pieces)
        assert joined(out, "delta") == text and not any("args" in o for o in out)


def test_a_shaper_made_from_committed_text_continues_exactly():
    whole = shaped(CallShaper("auto"), [CALL[i:i + 3] for i in range(0, len(CALL), 3)])
    for cut in range(len(CALL)):
        first = CallShaper("auto")
        committed = ""
        for i in range(0, cut, 3):
            o = first.push(CALL[i:min(i + 3, cut)], False)
            committed += o.get("call", {}).get("head", "") + o.get("args", "") + o.get("delta", "")
        # the engine gives again what was not committed
        rest = shaped(CallShaper("auto", committed), [CALL[len(committed):]])
        assert committed + "".join(o.get("call", {}).get("head", "") + o.get("args", "") + o.get("delta", "")
                                   + o.get("tail", "") for o in rest) == CALL
        assert joined(whole, "args") == calls.split(CALL, finished=True)[1] == ARGS


def test_split_ids_and_mode():
    assert calls.split(CALL, finished=True) == ("get_weather", ARGS)
    assert calls.split('{"name": "f", "arguments": {"a": 1', finished=False) == ("f", '{"a": 1')
    assert calls.split("plain text", finished=True) is None
    assert calls.ids("msg_01ABC") == ("fc_01ABC", "call_01ABC")
    assert calls.mode({"tools": [{"name": "f"}]}) == "auto"
    assert calls.mode({"tools": [{"name": "f"}], "tool_choice": "none"}) is None
    assert calls.mode({"tools": [{"name": "f"}], "tool_choice": {"type": "function", "name": "f"}}) == "required"
    assert calls.mode({"tools": []}) is None
