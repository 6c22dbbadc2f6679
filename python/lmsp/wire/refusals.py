"""The fields of OpenAI's requests that ask for a feature these endpoints do not
have: a value that asks for nothing is accepted, any other is a 400
``invalid_request`` naming the field, so that a client never thinks a feature
worked when it was ignored. One table for Chat Completions and Completions.

A request's Struct declares each of these fields with the type OpenAI gives it
(a value of another type is refused as any field's is); the document's schema of
the field is the value that asks for nothing (:func:`nothing_asked`).
"""

from __future__ import annotations

from typing import Any, Callable

from lmsp.errors import InvalidRequest

from .structs import JSON

Check = Callable[[Any], bool]  # True: the value asks for nothing


def _zero(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def _empty(value: Any) -> bool:
    return value in ([], {})


def _one(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 1


def _never(value: Any) -> bool:
    return False


def _null(schema: JSON) -> JSON:
    return {"anyOf": [schema, {"type": "null"}]}


_NULL: JSON = {"type": "null"}

#: field -> (what asks for nothing, what the service lacks, the schema of what asks for nothing)
UNSUPPORTED: dict[str, tuple[Check, str, JSON]] = {
    "n": (_one, "more than one choice per request ('n' must be 1)", _null({"const": 1})),
    "best_of": (_one, "more than one candidate per request ('best_of' must be 1)", _null({"const": 1})),
    "presence_penalty": (_zero, "a presence penalty ('presence_penalty' must be 0)", _null({"const": 0})),
    "frequency_penalty": (_zero, "a frequency penalty ('frequency_penalty' must be 0)", _null({"const": 0})),
    "logit_bias": (_empty, "logit bias", _null({"type": "object", "maxProperties": 0})),
    "functions": (_empty, "the deprecated functions (use 'tools')", _null({"type": "array", "maxItems": 0})),
    "function_call": (lambda v: v == "none", "the deprecated function calls (use 'tools')", _null({"const": "none"})),
    "modalities": (lambda v: v == ["text"], "output other than text", _null({"const": ["text"]})),
    "audio": (_never, "audio output", _NULL),
    "prediction": (_never, "predicted outputs", _NULL),
    "web_search_options": (_never, "web search", _NULL),
    "reasoning_effort": (_never, "a reasoning effort", _NULL),
    "verbosity": (_never, "a verbosity setting", _NULL),
}


def nothing_asked(fields: tuple[str, ...]) -> JSON:
    """The schemas of ``fields`` in a request's document: the values that ask for nothing."""
    return {name: UNSUPPORTED[name][2] for name in fields}


def refuse_unsupported(asked: Any, fields: tuple[str, ...]) -> None:
    """400 for the first of ``fields`` whose value in the request read (``asked``) asks for
    what the service lacks; a field that is absent or null asks for nothing."""
    for name in fields:
        value = getattr(asked, name)
        if value is None:
            continue
        accepts, feature, _ = UNSUPPORTED[name]
        if not accepts(value):
            raise InvalidRequest(f"{name!r}: this endpoint does not support {feature}", param=name)
