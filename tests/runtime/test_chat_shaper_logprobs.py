"""Log probabilities on the chat layer: the tokens whose text makes up the
message go with its deltas and its done events; those of the reasoning, of a
call and of the format's markers go nowhere; a shaper made from the committed
text and log probabilities continues exactly."""
from __future__ import annotations

import json

import pytest
from test_chat_shaper import CALL, ITEM_ID, THOUGHT, events, think_parse, tools_parse  # noqa: F401

from lmsp.items import chat as ci
from lmsp.runtime.chat_shaper import ChatShaper, text_tokens


def entry(piece: str | bytes) -> dict:
    data = piece if isinstance(piece, bytes) else piece.encode()
    return {"token": data.decode(errors="replace"), "logprob": -0.5, "bytes": list(data), "top_logprobs": []}


def feed(shaper: ChatShaper, pieces: list[str], final: bool = True) -> list[tuple]:
    rows = []
    for i, piece in enumerate(pieces):
        shaper.take_logprobs([entry(piece)])
        shaper.push(piece, final and i == len(pieces) - 1)
        rows += shaper.made()
    return rows


def tokens_of(text: str, step: int = 2) -> list[str]:
    return [text[i : i + step] for i in range(0, len(text), step)]


def placed(evs: list[tuple[str, dict]], etype: str = ci.TEXT_DELTA) -> str:
    return "".join(e["token"] for t, p in evs if t == etype for e in p["logprobs"])


def test_the_reasoning_s_tokens_are_left_out(think_parse) -> None:  # noqa: F811
    evs = events(feed(ChatShaper(think_parse, ITEM_ID), tokens_of(THOUGHT)))
    text = "".join(p["delta"] for t, p in evs if t == ci.TEXT_DELTA)
    assert text == "It is sunny."
    assert text in placed(evs) and placed(evs).strip() == text  # the tokens of its text, nothing of the thought
    assert all("logprobs" not in p for t, p in evs if t == ci.REASONING_DELTA)
    items = ci.fold([(t, json.dumps(p)) for t, p in evs], "completed")
    assert [e["token"] for e in items[1]["content"][0]["logprobs"]] == [
        e["token"] for t, p in evs if t == ci.TEXT_DELTA for e in p["logprobs"]]  # fmt: skip




def test_text_then_a_call_the_message_keeps_its_text_s_tokens(tools_parse) -> None:  # noqa: F811
    evs = events(feed(ChatShaper(tools_parse, ITEM_ID), tokens_of("Let me check.\n" + CALL, 3)))
    # the last token of the text holds the call's first character too: it is the text's
    assert placed(evs) == "Let me check.\n<" and tokens_of("Let me check.\n" + CALL, 3)[4] == ".\n<"
    [done] = [p for t, p in evs if t == ci.TEXT_DONE]
    [part] = [p["part"] for t, p in evs if t == ci.PART_DONE]
    [item] = [p["item"] for t, p in evs if t == ci.ITEM_DONE and p["item"]["type"] == "message"]
    wanted = [e for t, p in evs if t == ci.TEXT_DELTA for e in p["logprobs"]]
    assert done["logprobs"] == part["logprobs"] == item["content"][0]["logprobs"] == wanted


def test_a_resumed_shaper_continues_exactly(tools_parse) -> None:  # noqa: F811
    pieces = tokens_of("Let me check, please.\n" + CALL, 2)
    whole = events(feed(ChatShaper(tools_parse, ITEM_ID), pieces))
    for cut in range(1, len(pieces)):
        first = ChatShaper(tools_parse, ITEM_ID)
        before = feed(first, pieces[:cut], final=False)
        committed = "".join(raw for _, raw, _ in before if raw is not None)
        logprobs = [e for t, _, p in before if t == ci.TEXT_DELTA for e in p["logprobs"]]
        again = ChatShaper(tools_parse, ITEM_ID, committed, logprobs=logprobs)
        rest = "".join(pieces)[len(committed) :]  # the engine gives the text not committed again
        after = feed(again, [t for t in tokens_of(rest, 2)])
        assert events(before) + events(after) == whole, cut


@pytest.mark.parametrize(
    "pieces,delta,wanted",
    [
        (["</think>", "\n\n", "It"], "It", [2]),  # the markers and the space the format strips: not the text's
        ([" It"], "It", [0]),  # a token whose text is partly the message's is in
        (["<", "b"], "Hi <b", [0, 1]),  # text a token before them began
        (["s.", "<tool", "_call>"], "Yes.", [0]),  # the delta ends where their text begins
        (["<tool_call>"], "Yes.", []),
        (["a"], "", []),
        ([b"ier", b"\xe2"], "Fourier\ufffd", [0, 1]),  # an incomplete last character: the flushed text's
        ([b"\xe2"], "\ufffd", [0]),
    ],
)
def test_the_tokens_of_a_delta(pieces, delta, wanted) -> None:
    entries = [entry(p) for p in pieces]
    assert text_tokens(entries, delta) == [entries[i] for i in wanted]
