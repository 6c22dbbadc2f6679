"""The commit thread's log probabilities: engine results into OpenAI's entries, and
those of tokens committed before their text go with that text."""
from __future__ import annotations

import threading
from types import SimpleNamespace
from unittest import mock

from lmsp.items.chat import TEXT_DELTA
from lmsp.runtime.chat_shaper import ChatShaper
from lmsp.runtime.committer import Committer
from lmsp.runtime.logprobs import FLOOR, result_logprobs
from lmsp.runtime.calls import CallShaper
from lmsp.runtime.state import Run

PIECES = {1: b"\xc3", 2: b"\xa9", 3: b"!", 4: b"?"}  # "é" is two tokens


class PieceEngine:
    def token_bytes(self, token: int) -> bytes:
        return PIECES[token]


class RecordingStore:
    EVENT_ROW = ("seq", "type", "created_at", "text", "data")

    def __init__(self) -> None:
        self.items: list[dict] = []

    def append_step(self, owner, items, with_events=False):
        self.items.extend(dict(item) for item in items)
        return {}


def result(tokens, text, logprobs, top=None, finish=None) -> dict:
    out = {"seq": 1, "tokens": tokens, "text": text, "finish": finish, "error": None, "n_prompt": 1,
           "n_generated": 1, "n_cached": 0, "timings": {}, "logprobs": logprobs}
    if top is not None:
        out["top_logprobs"] = top
    return out


def test_entries_carry_token_text_bytes_and_alternatives():
    entries = result_logprobs(PieceEngine(), result([3, 4], "!?", [-0.5, float("-inf")],
                                                    top=[[(3, -0.5), (4, -1.0)], [(3, -0.1)]]))
    assert entries == [
        {"token": "!", "logprob": -0.5, "bytes": [33],
         "top_logprobs": [{"token": "!", "logprob": -0.5, "bytes": [33]}, {"token": "?", "logprob": -1.0,
                                                                            "bytes": [63]}]},
        {"token": "?", "logprob": FLOOR, "bytes": [63], "top_logprobs": [{"token": "!", "logprob": -0.1,
                                                                          "bytes": [33]}]},
    ]
    assert result_logprobs(PieceEngine(), {**result([3], "!", []), "logprobs": []}) == []


def committer() -> tuple[Committer, RecordingStore, Run]:
    store = RecordingStore()
    run = Run(task_id="task_1", model="m", attempt=1, engine=PieceEngine(), seq=1)
    state = SimpleNamespace(
        store=store, config=SimpleNamespace(commit_window_ms=0), owner="w", lock=threading.Lock(),
        runs={"task_1": run}, by_seq={}, committed={}, stats=mock.Mock(), waiters=mock.Mock(),
        wake_scheduler=mock.Mock(), kvdisk=mock.Mock())
    return Committer(state, close_deleted=lambda: None), store, run


def test_logprobs_of_tokens_committed_before_their_text_go_with_it():
    c, store, run = committer()
    c.take(run, result([1], "", [-0.25]), now=0.0)  # half a character: no text yet
    assert c.commit()
    c.take(run, result([2], "é", [-0.75]), now=1.0)
    c.take(run, result([3], "!", [-0.5]), now=1.0)
    assert c.commit()
    first, second = store.items
    assert first["delta"] == "" and first["tokens"] == [1]
    assert second["delta"] == "é!"
    assert [(e["bytes"], e["logprob"]) for e in second["logprobs"]] == [([0xC3], -0.25), ([0xA9], -0.75),
                                                                        ([33], -0.5)]
    assert not c.held_logprobs


def test_held_logprobs_of_an_earlier_attempt_are_dropped():
    c, store, run = committer()
    c.take(run, result([1], "", [-0.25]), now=0.0)
    assert c.commit()
    run.attempt = 2  # claimed again: its output starts over
    c.take(run, result([3], "!", [-0.5]), now=1.0)
    assert c.commit()
    assert [e["token"] for e in store.items[-1]["logprobs"]] == ["!"]


def test_the_tokens_of_a_call_keep_no_logprobs_waiting():
    """A call's tokens have no text delta: their entries are not held for a text that
    never comes (each commit would carry all of them again)."""
    c, store, run = committer()
    run.calls = CallShaper("required")
    for i, piece in enumerate(['{"name": "f", ', '"arguments": {', '"a": 1', "}}"]):
        c.take(run, result([3], piece, [-0.5], finish="stop" if i == 3 else None), now=float(i))
        assert c.commit()
        assert not c.held_logprobs or i == 0  # the call's head not whole yet: its kind unknown
    assert all("calls" in item for item in store.items[1:])
    assert max(len(item.get("logprobs", ())) for item in store.items) <= 2  # the first ones go once


def test_on_the_chat_layer_the_tokens_of_text_not_taken_yet_are_held_back():
    """A token whose text the chat layer's shaper has not taken (half a character here)
    keeps its log probabilities waiting in the shaper: it is held back, not committed
    with the text before it, so that a resume samples it again and gives them again."""
    c, store, run = committer()
    run.calls = ChatShaper(lambda text, partial: {"content": text}, "msg_1")
    c.take(run, result([3], "!", [-0.5]), now=0.0)
    c.take(run, result([1], "", [-0.25]), now=0.0)
    assert c.commit()
    c.take(run, result([2], "é", [-0.75]), now=1.0)
    assert c.commit()
    first, second = store.items
    assert (first["tokens"], first["held_tokens"]) == ([3], [1])
    assert second["tokens"] == [2] and "held_tokens" not in second
    deltas = [p for item in store.items for t, _, p in item["rows"] if t == TEXT_DELTA]
    assert [[e["bytes"] for e in p["logprobs"]] for p in deltas] == [[[33]], [[0xC3], [0xA9]]]
