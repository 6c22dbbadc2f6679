"""What a request asks of the output's form, as the engine's grammar.

``text.format`` ``json_schema`` is held to the grammar llama.cpp's JSON-schema
converter makes of its schema, ``json_object`` to that of ``{"type":
"object"}``; ``text`` (the default) to nothing. Function tools (with
``tool_choice`` other than ``none``) are held to the service's own call
format (:mod:`lmsp.calls`): the grammar of ``{"name", "arguments"}`` objects,
one alternative per tool with its parameters' schema; with ``required`` or a
named tool the grammar holds from the first token, with ``auto`` it is lazy,
triggered by an output that opens with ``{``; with ``auto`` and a JSON
``text.format`` the output is a call or the answer in that form. A schema the
converter cannot
express is refused when the task is created (:func:`check`), never run
unconstrained.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from .. import calls
from ..errors import InvalidRequest

SCHEMA_PARAM = "text.format.schema"
ANY_OBJECT = {"type": "object"}
# an output that opens with "{" (after space) is a call; the grammar is fed from the brace
CALL_TRIGGER = {"type": "pattern", "value": r"^\s*(\{)"}


@lru_cache(maxsize=256)
def _schema_grammar(schema_json: str) -> str:
    from .. import native  # the extension loads in the workers only

    return native.schema_grammar(schema_json)


def schema_grammar(schema: dict[str, Any]) -> str:
    """The grammar of a schema (its properties' order kept: it is the output's)."""
    return _schema_grammar(json.dumps(schema))


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


def tool_mode(request: dict[str, Any]) -> str | None:
    """``required``, ``auto`` or None: :func:`lmsp.calls.mode`."""
    return calls.mode(request)


def callable_tools(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The tools the model may call: all of them, or the one ``tool_choice`` names."""
    tools: list[dict[str, Any]] = request.get("tools") or []
    choice = request.get("tool_choice")
    if isinstance(choice, dict):
        return [t for t in tools if t["name"] == choice.get("name")]
    return tools


def call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The schema of one call of any of ``tools``: the name first, then the arguments."""
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t["name"]}, "arguments": t.get("parameters") or ANY_OBJECT},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }


def grammar(request: dict[str, Any]) -> dict[str, Any] | None:
    """The engine's ``grammar`` argument for a request (None: unconstrained);
    ValueError for a schema the converter cannot express."""
    mode = tool_mode(request)
    schema = output_schema(request)
    if mode is not None:
        calls_schema = call_schema(callable_tools(request))
        if mode == "auto" and schema is not None:  # a call, or the answer in its form
            return {"gbnf": schema_grammar({"anyOf": [*calls_schema["anyOf"], schema]})}
        gbnf = schema_grammar(calls_schema)
        if mode == "auto":
            return {"gbnf": gbnf, "lazy": True, "triggers": [CALL_TRIGGER]}
        return {"gbnf": gbnf}
    if schema is None:
        return None
    return {"gbnf": schema_grammar(schema)}


def check(request: dict[str, Any]) -> None:
    """A request whose output form cannot be held to: InvalidRequest (400)."""
    if tool_mode(request) is not None:
        for i, tool in enumerate(request.get("tools") or ()):
            try:
                schema_grammar(tool.get("parameters") or ANY_OBJECT)
            except ValueError as exc:
                param = f"tools[{i}].parameters"
                raise InvalidRequest(f"'{param}' is not supported: {exc}", param=param) from None
    try:
        grammar(request)
    except ValueError as exc:
        param = "tools" if tool_mode(request) is not None else SCHEMA_PARAM
        raise InvalidRequest(f"'{param}' is not supported: {exc}", param=param) from None
