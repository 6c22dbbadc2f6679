"""Log probabilities in the shapes of OpenAI's Chat Completions and legacy
Completions, made from the entries the engine's results leave in the task's
delta events (``{"token", "logprob", "bytes", "top_logprobs": [...]}``, as the
Responses API hands them out).

Chat Completions shows the entries as they are (``logprobs.content``). The
legacy shape is four parallel arrays: ``tokens``, ``token_logprobs``,
``top_logprobs`` (a dict per token: the alternatives the request asked for and
the sampled token) and ``text_offset`` (each token's first character in the
choice's text). A prompt's tokens that ``echo`` shows have no log probability
from the engine: null in ``token_logprobs`` and ``top_logprobs``.
"""

from __future__ import annotations

import codecs
from typing import Any


def response_logprobs(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries of a Response object's output text ([] when there are none)."""
    for item in response.get("output") or []:
        for part in item.get("content") or []:
            if part.get("type") == "output_text":
                return list(part.get("logprobs") or [])
    return []


def chat_logprobs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A Chat Completions choice's ``logprobs``."""
    return {"content": entries, "refusal": None}


def _top(entry: dict[str, Any]) -> dict[str, float]:
    """The alternatives of a token as a dict, most likely first, the sampled token with
    them (a text that two tokens share keeps the likelier one's)."""
    out: dict[str, float] = {}
    for alt in entry.get("top_logprobs") or ():
        out.setdefault(str(alt["token"]), float(alt["logprob"]))
    out.setdefault(str(entry["token"]), float(entry["logprob"]))
    return out


class LegacyLogprobs:
    """Entries into the legacy arrays, keeping the text offset from one call to the
    next (a stream's chunks continue where the one before ended)."""

    def __init__(self) -> None:
        self.offset = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def _advance(self, piece: bytes) -> int:
        """The offset of a token whose bytes are ``piece``; a token that ends part of a
        character starts where that character starts."""
        at = self.offset
        self.offset += len(self.decoder.decode(piece))
        return at

    def echoed(self, pieces: list[bytes], text: str) -> dict[str, Any]:
        """The prompt's tokens (their bytes), without log probabilities; ``text``: the
        echoed prompt, after which the output starts (a tokenizer may have added a
        space in front of the prompt's first word)."""
        out = {
            "tokens": [p.decode("utf-8", errors="replace") for p in pieces],
            "token_logprobs": [None] * len(pieces),
            "top_logprobs": [None] * len(pieces),
            "text_offset": [min(self._advance(p), len(text)) for p in pieces],
        }
        self.offset = len(text)
        self.decoder.reset()
        return out

    def generated(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """The output's tokens."""
        return {
            "tokens": [str(e["token"]) for e in entries],
            "token_logprobs": [float(e["logprob"]) for e in entries],
            "top_logprobs": [_top(e) for e in entries],
            "text_offset": [self._advance(bytes(e["bytes"])) for e in entries],
        }


def joined(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Two legacy ``logprobs`` objects, one after the other."""
    return {name: first[name] + second[name] for name in first}


def legacy_logprobs(entries: list[dict[str, Any]], pieces: list[bytes], echo: str) -> dict[str, Any]:
    """A text completion's ``logprobs``: the echoed prompt's tokens (``pieces``, the
    bytes of each; none without ``echo``) then the output's."""
    state = LegacyLogprobs()
    head = state.echoed(pieces, echo)
    return joined(head, state.generated(entries))
