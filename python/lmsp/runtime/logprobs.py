"""An engine result's log probabilities as the Responses API hands them out: one
entry per token, ``{"token", "logprob", "bytes", "top_logprobs": [...]}`` (OpenAI's
``Logprob``), where ``token`` is the token's text and ``bytes`` its UTF-8 bytes
(a token may hold part of a character: its ``token`` then shows U+FFFD)."""

from __future__ import annotations

from typing import Any

from ..contracts import EngineResult

FLOOR = -9999.0  # a probability that underflows is given as this (JSON has no -inf)


def _entry(engine: Any, token: int, logprob: float) -> dict[str, Any]:
    piece = bytes(engine.token_bytes(int(token)))
    value = float(logprob)
    return {
        "token": piece.decode("utf-8", errors="replace"),
        "logprob": value if value > FLOOR else FLOOR,
        "bytes": list(piece),
    }


def result_logprobs(engine: Any, result: EngineResult) -> list[dict[str, Any]]:
    """The entries of ``result``'s tokens ([] for a result without log probabilities)."""
    values = result.get("logprobs")
    if not values:
        return []
    tops = result.get("top_logprobs") or []
    out = []
    for i, (token, logprob) in enumerate(zip(result.get("tokens") or (), values)):
        entry = _entry(engine, token, logprob)
        entry["top_logprobs"] = [_entry(engine, t, lp) for t, lp in (tops[i] if i < len(tops) else ())]
        out.append(entry)
    return out
