"""The fields of OpenAI's requests that ask for a feature these endpoints do not
have: a value that asks for nothing is accepted, any other is a 400
``invalid_request`` naming the field, so that a client never thinks a feature
worked when it was ignored. One table for Chat Completions and Completions.
"""

from __future__ import annotations

from typing import Any, Callable

from lmsp.errors import InvalidRequest

Check = Callable[[Any], bool]  # True: the value asks for nothing


def _zero(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def _empty(value: Any) -> bool:
    return value in ([], {})


def _one(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 1


#: field -> (what asks for nothing, what the service lacks)
UNSUPPORTED: dict[str, tuple[Check, str]] = {
    "n": (_one, "more than one choice per request ('n' must be 1)"),
    "best_of": (_one, "more than one candidate per request ('best_of' must be 1)"),
    "presence_penalty": (_zero, "a presence penalty ('presence_penalty' must be 0)"),
    "frequency_penalty": (_zero, "a frequency penalty ('frequency_penalty' must be 0)"),
    "logit_bias": (_empty, "logit bias"),
    "functions": (_empty, "the deprecated functions (use 'tools')"),
    "function_call": (lambda v: v == "none", "the deprecated function calls (use 'tools')"),
    "modalities": (lambda v: v == ["text"], "output other than text"),
    "audio": (lambda v: False, "audio output"),
    "prediction": (lambda v: False, "predicted outputs"),
    "web_search_options": (lambda v: False, "web search"),
    "reasoning_effort": (lambda v: False, "a reasoning effort"),
    "verbosity": (lambda v: False, "a verbosity setting"),
}


def refuse_unsupported(body: dict[str, Any], fields: tuple[str, ...]) -> None:
    """400 for the first of ``fields`` whose value in ``body`` asks for what the service
    lacks; a field that is absent or null asks for nothing."""
    for name in fields:
        value = body.get(name)
        if value is None:
            continue
        accepts, feature = UNSUPPORTED[name]
        if not accepts(value):
            raise InvalidRequest(f"{name!r}: this endpoint does not support {feature}", param=name)
