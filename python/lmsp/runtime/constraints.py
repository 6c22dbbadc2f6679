"""What a request asks of the output's form, as the engine's grammar.

``text.format`` ``json_schema`` is held to the grammar llama.cpp's JSON-schema
converter makes of its schema, ``json_object`` to that of ``{"type":
"object"}``; ``text`` (the default) to nothing. A schema the converter cannot
express is refused when the task is created (:func:`check`), never run
unconstrained.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from ..errors import InvalidRequest

SCHEMA_PARAM = "text.format.schema"
ANY_OBJECT = {"type": "object"}


@lru_cache(maxsize=256)
def _schema_grammar(schema_json: str) -> str:
    from .. import native  # the extension loads in the workers only

    return native.schema_grammar(schema_json)


def output_schema(request: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema the output is held to (None: free text)."""
    fmt = (request.get("text") or {}).get("format") or {}
    kind = fmt.get("type")
    if kind == "json_schema":
        schema: dict[str, Any] = fmt.get("schema") or ANY_OBJECT
        return schema
    if kind == "json_object":
        return ANY_OBJECT
    return None


def grammar(request: dict[str, Any]) -> dict[str, Any] | None:
    """The engine's ``grammar`` argument for a request (None: unconstrained);
    ValueError for a schema the converter cannot express."""
    schema = output_schema(request)
    if schema is None:
        return None
    return {"gbnf": _schema_grammar(json.dumps(schema, sort_keys=True))}


def check(request: dict[str, Any]) -> None:
    """A request whose output form cannot be held to: InvalidRequest (400)."""
    try:
        grammar(request)
    except ValueError as exc:
        raise InvalidRequest(f"'{SCHEMA_PARAM}' is not supported: {exc}", param=SCHEMA_PARAM) from None
