"""Structured output and function tools of a create request (LMSP B.11): the
``text`` field's format, ``tools`` and the fields that go with them, and the
function call items of ``input``, checked and made into what the task keeps
(:func:`tools_and_format`, :func:`call_message`).

``text.format`` is ``{"type": "text"}`` (the default), ``{"type":
"json_object"}`` or ``{"type": "json_schema", "name", "schema",
"description", "strict"}``. Whether a schema can be held to by a grammar is
the runtime's to say, when the task is created (a 400 with ``param:
"text.format.schema"``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from lmsp.errors import InvalidRequest

from .fields import reject_unknown

FORMAT_TYPES = ("text", "json_object", "json_schema")
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_SCHEMA_BYTES = 32 * 1024  # a schema's JSON text
TEXT_FORMAT = {"type": "text"}


def parse_text(value: Any) -> dict[str, Any]:
    """``text``: ``{"format": ...}`` as the task keeps it and the Response echoes it."""
    if value is None:
        return {"format": dict(TEXT_FORMAT), "verbosity": "medium"}
    if not isinstance(value, dict):
        raise InvalidRequest("'text' must be an object", param="text")
    reject_unknown(value, ("format", "verbosity"), where="text.")
    out: dict[str, Any] = {"format": parse_format(value.get("format")), "verbosity": "medium"}
    verbosity = value.get("verbosity")
    if verbosity is not None and verbosity != "medium":
        raise InvalidRequest(
            "'text.verbosity' can only be 'medium' on this service: the model answers at its own length",
            param="text.verbosity",
        )
    return out


def parse_format(fmt: Any) -> dict[str, Any]:
    if fmt is None:
        return dict(TEXT_FORMAT)
    if not isinstance(fmt, dict):
        raise InvalidRequest("'text.format' must be an object", param="text.format")
    kind = fmt.get("type")
    if kind not in FORMAT_TYPES:
        raise InvalidRequest(f"'text.format.type' must be one of {', '.join(FORMAT_TYPES)}", param="text.format.type")
    if kind != "json_schema":
        reject_unknown(fmt, ("type",), where="text.format.")
        return {"type": kind}
    reject_unknown(fmt, ("type", "name", "schema", "description", "strict"), where="text.format.")
    name = fmt.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidRequest(
            "'text.format.name' is required: 1 to 64 of a-z, A-Z, 0-9, '_' and '-'", param="text.format.name"
        )
    description = fmt.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest("'text.format.description' must be a string", param="text.format.description")
    strict = fmt.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest("'text.format.strict' must be a boolean", param="text.format.strict")
    schema = check_schema(fmt.get("schema"), "text.format.schema")
    return {"type": "json_schema", "name": name, "description": description, "schema": schema, "strict": bool(strict)}


def check_schema(schema: Any, param: str) -> dict[str, Any]:
    """A JSON Schema object of reasonable size (what it admits is the grammar's to say)."""
    if not isinstance(schema, dict):
        raise InvalidRequest(f"'{param}' must be a JSON Schema object", param=param)
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        raise InvalidRequest(f"'{param}' is larger than {MAX_SCHEMA_BYTES} bytes", param=param)
    return schema


# -- function tools -------------------------------------------------------------

#: the create request's fields this module checks
FIELDS = ("text", "tools", "tool_choice")  # parallel_tool_calls, max_tool_calls: options

CHOICES = ("auto", "none", "required")
MAX_TOOLS = 128
CALL_ITEMS = ("function_call", "function_call_output")
MAX_CALL_ID = 64
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def tools_and_format(body: dict[str, Any]) -> dict[str, Any]:
    """Every field of :data:`FIELDS` as the task keeps it and the Response echoes it."""
    return {"text": parse_text(body.get("text")), **parse_tool_fields(body)}


def parse_tool_fields(body: dict[str, Any]) -> dict[str, Any]:
    """``tools`` and ``tool_choice`` as the task keeps them and the Response echoes them."""
    tools = parse_tools(body.get("tools"))
    return {"tools": tools, "tool_choice": parse_tool_choice(body.get("tool_choice"), tools)}


def parse_tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest("'tools' must be an array", param="tools")
    if len(value) > MAX_TOOLS:
        raise InvalidRequest(f"'tools' has more than {MAX_TOOLS} tools", param="tools")
    tools: list[dict[str, Any]] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"'{where}' must be an object", param=where)
        if tool.get("type") != "function":
            raise InvalidRequest(
                f"'{where}.type' must be 'function': only function tools are supported", param=f"{where}.type"
            )
        reject_unknown(tool, ("type", "name", "description", "parameters", "strict"), where=f"{where}.")
        name = tool.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise InvalidRequest(
                f"'{where}.name' is required: 1 to 64 of a-z, A-Z, 0-9, '_' and '-'", param=f"{where}.name"
            )
        if any(t["name"] == name for t in tools):
            raise InvalidRequest(f"tool name {name!r} is given twice", param=f"{where}.name")
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise InvalidRequest(f"'{where}.description' must be a string", param=f"{where}.description")
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidRequest(f"'{where}.strict' must be a boolean", param=f"{where}.strict")
        params = tool.get("parameters")
        params = EMPTY_PARAMETERS if params is None else check_schema(params, f"{where}.parameters")
        if params.get("type", "object") != "object":
            raise InvalidRequest(
                f"'{where}.parameters' must be the schema of an object (the call's arguments)",
                param=f"{where}.parameters",
            )
        tools.append(
            {
                "type": "function",
                "name": name,
                "description": description,
                "parameters": params,
                "strict": True if strict is None else strict,
            }
        )
    return tools


def parse_tool_choice(value: Any, tools: list[dict[str, Any]]) -> Any:
    if value is None:
        return "auto"
    if isinstance(value, str):
        if value not in CHOICES:
            raise InvalidRequest(
                f"'tool_choice' must be one of {', '.join(CHOICES)} or a function", param="tool_choice"
            )
        if value == "required" and not tools:
            raise InvalidRequest("'tool_choice' 'required' needs 'tools'", param="tool_choice")
        return value
    if not isinstance(value, dict) or value.get("type") != "function":
        raise InvalidRequest(
            '\'tool_choice\' must be auto, none, required or {"type": "function", "name"}', param="tool_choice"
        )
    reject_unknown(value, ("type", "name"), where="tool_choice.")
    name = value.get("name")
    if not any(t["name"] == name for t in tools):
        raise InvalidRequest(f"'tool_choice' names {name!r}, which is not in 'tools'", param="tool_choice.name")
    return {"type": "function", "name": name}


def call_message(item: dict[str, Any], where: str, calls: dict[str, str]) -> dict[str, str]:
    """A ``function_call`` or ``function_call_output`` input item as the chat message the
    model reads (:mod:`lmsp.history`); ``calls`` maps the call ids of the calls so far
    to their names."""
    from lmsp import history

    kind = item["type"]
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not 1 <= len(call_id) <= MAX_CALL_ID:
        raise InvalidRequest(
            f"'{where}.call_id' must be a string of 1 to {MAX_CALL_ID} characters", param=f"{where}.call_id"
        )
    if kind == "function_call":
        reject_unknown(item, ("type", "id", "call_id", "name", "arguments", "status"), where=f"{where}.")
        name, arguments = item.get("name"), item.get("arguments")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise InvalidRequest(f"'{where}.name' must be a function name", param=f"{where}.name")
        if not isinstance(arguments, str):
            raise InvalidRequest(f"'{where}.arguments' must be a string", param=f"{where}.arguments")
        calls[call_id] = name
        return history.call_message(name, arguments, call_id)
    reject_unknown(item, ("type", "id", "call_id", "output", "status"), where=f"{where}.")
    if call_id not in calls:
        raise InvalidRequest(
            f"'{where}.call_id' {call_id!r} matches no function_call before it", param=f"{where}.call_id"
        )
    output = item.get("output")
    if isinstance(output, list):
        parts = [p.get("text") for p in output if isinstance(p, dict) and p.get("type") in ("input_text", "text")]
        if len(parts) != len(output) or not all(isinstance(p, str) for p in parts):
            raise InvalidRequest(f"'{where}.output' must be a string or text parts", param=f"{where}.output")
        output = "".join(parts)  # type: ignore[arg-type]
    if not isinstance(output, str):
        raise InvalidRequest(f"'{where}.output' must be a string or text parts", param=f"{where}.output")
    return history.output_message(calls[call_id], call_id, output)
