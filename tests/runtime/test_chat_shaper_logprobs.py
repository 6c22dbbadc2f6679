"""Log probabilities on the chat layer: the tokens whose text makes up the
message go with its deltas and its done events; those of the reasoning, of a
call and of the format's markers go nowhere; a shaper made from the committed
text and log probabilities continues exactly."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_chat_shaper import CALL, ITEM_ID, THOUGHT, events, think_parse, tools_parse  # noqa: F401

from lmsp.items import chat as ci
from lmsp.native import TextStream
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


# Tokens of an output holding invalid UTF-8: the engine's text shows one U+FFFD for each
# maximal ill-formed subpart (one for an incomplete last character, at the end).
INVALID = {
    "a lone byte before a space": [b" Fourier", b"\xc8", b" designer", b" ingl\xc3\xaas"],
    "a lone continuation byte": [b"ab", b"\x80", b"c\x80\x80", b"d"],
    "a truncated 2-byte character": [b"x", b"\xc3", b"y", b"\xc3\xa9"],
    "a truncated 3-byte character": [b"x\xe2", b"\x82", b" y\xe2\x82", b"\xac"],
    "a truncated 4-byte character": [b"\xf0\x9f", b"\x98", b"z", b"\xf0", b"\x9f\x98\x80!"],
    "an invalid lead byte mid-text": [b"ok", b"\xff\xfe", b"ok\xc0\xaf", b"."],
    "invalid bytes first": [b"\x80", b"\xff", b"start"],
    "an incomplete character last": [b"end ", b"\xe6\x97"],
    "an invalid byte last": [b"end", b"\xf5"],
    "a character split over three tokens": [b"a", b"\xf0", b"\x9f", b"\x98\x80", b"b"],
}


def cuts(n: int):
    """Every way to cut ``n`` tokens into consecutive polls."""
    for mask in range(1 << (n - 1)):
        yield [i + 1 for i in range(n - 1) if mask >> i & 1]


def polls(tokens: list[bytes], points: list[int]) -> list[list[bytes]]:
    edges = [0, *points, len(tokens)]
    return [tokens[a:b] for a, b in zip(edges, edges[1:])]


@pytest.mark.parametrize("tokens", INVALID.values(), ids=INVALID.keys())
def test_a_delta_s_tokens_do_not_depend_on_how_the_text_was_cut(tokens) -> None:
    entries = [entry(t) for t in tokens]
    by_bytes = dict(zip(tokens, entries))
    for points in cuts(len(tokens)):
        stream, waiting, placed, text = TextStream(), [], [], ""
        for i, poll in enumerate(polls(tokens, points)):
            waiting += [by_bytes[t] for t in poll]
            delta = "".join(stream.push(t) for t in poll) + (stream.flush() if i == len(points) else "")
            if delta:  # a push that shows nothing leaves its tokens waiting (ChatShaper)
                placed += text_tokens(waiting, delta)
                waiting, text = [], text + delta
        assert text == b"".join(tokens).decode("utf-8", "replace")
        assert placed == entries, points


def shaped(parse, tokens: list[bytes], points: list[int]) -> list[dict]:
    """The entries a shaper puts on the message's deltas, the engine's text of
    ``tokens`` pushed in the polls cut at ``points``."""
    entries = [entry(t) for t in tokens]
    shaper, stream, start = ChatShaper(parse, ITEM_ID), TextStream(), 0
    for i, poll in enumerate(polls(tokens, points)):
        shaper.take_logprobs(entries[start : start + len(poll)])
        start += len(poll)
        last = i == len(points)
        shaper.push("".join(stream.push(t) for t in poll) + (stream.flush() if last else ""), last)
    return [e for t, p in events(shaper.made()) if t == ci.TEXT_DELTA for e in p["logprobs"]]


def as_text(text: str, partial: bool) -> dict:
    return {"content": text}


@pytest.mark.parametrize("tokens", INVALID.values(), ids=INVALID.keys())
def test_a_shaper_places_every_token_of_a_text_holding_invalid_bytes(tokens) -> None:
    for points in cuts(len(tokens)):
        assert shaped(as_text, tokens, points) == [entry(t) for t in tokens], points


def test_text_holding_an_invalid_byte_then_a_call_whatever_the_cut(tools_parse) -> None:  # noqa: F811
    tokens = [b"Let", b"\xc8", b" me", b" check", b".\n", b"<tool", b"_call>\n", CALL[len("<tool_call>\n") :].encode()]
    for points in cuts(len(tokens)):
        assert shaped(tools_parse, tokens, points) == [entry(t) for t in tokens[:5]], points


# bytes that begin, continue or break UTF-8 characters, and a few that are valid alone
BYTES = st.sampled_from([0x20, 0x41, 0x80, 0x82, 0x98, 0x9F, 0xA0, 0xAC, 0xBF, 0xC0, 0xC3, 0xC8, 0xE0, 0xE2, 0xED,
                         0xF0, 0xF4, 0xF5, 0xFF])  # fmt: skip


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(st.lists(st.lists(BYTES, min_size=1, max_size=4).map(bytes), min_size=1, max_size=7), st.sets(st.integers(1, 6)))
def test_any_bytes_in_any_polls_place_every_token_once(tokens, points) -> None:
    cut = sorted(p for p in points if p < len(tokens))
    assert shaped(as_text, tokens, cut) == [entry(t) for t in tokens]
