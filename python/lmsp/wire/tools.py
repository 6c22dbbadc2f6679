"""Structured output and function tools of a create request (LMSP B.11): the
``text`` field's format, ``tools`` and ``tool_choice`` declared, and made into
what the task keeps (:func:`text_kept`, :func:`tools_kept`, :func:`choice_kept`).

``text.format`` is ``{"type": "text"}`` (the default), ``{"type":
"json_object"}`` or ``{"type": "json_schema", "name", "schema",
"description", "strict"}``. Whether a schema can be held to by a grammar is
the runtime's to say, when the task is created (a 400 with ``param:
"text.format.schema"``).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, Union

from msgspec import Meta

from lmsp.errors import InvalidRequest

from .structs import Body, Name, read

FORMAT_TYPES = ("text", "json_object", "json_schema")
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_SCHEMA_BYTES = 32 * 1024  # a schema's JSON text
TEXT_FORMAT = {"type": "text"}
MAX_TOOLS = 128
MAX_CALL_ID = 64
EMPTY_PARAMETERS = {"type": "object", "properties": {}}

#: why a value its type refuses is refused, by param (each index as ``[]``)
REASONS = {
    "tools[].type": "only function tools are supported",
    "text.verbosity": "it can only be 'medium' on this service: the model answers at its own length",
}


class TextFormatText(Body, tag_field="type", tag="text"):
    """Text, as the model writes it (the default)."""


class TextFormatJsonObject(Body, tag_field="type", tag="json_object"):
    """A JSON object, of any shape."""


class TextFormatJsonSchema(Body, tag_field="type", tag="json_schema"):
    """JSON that a schema admits; one the grammar cannot hold the output to is a 400 (``text.format.schema``)."""

    name: Name
    schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None


TextFormat = Union[TextFormatText, TextFormatJsonObject, TextFormatJsonSchema]


class TextOptions(Body):
    """The output's format (``verbosity``: only ``medium``)."""

    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None


Parameters = Annotated[dict[str, Any], Meta(description="The schema of the call's arguments (an object).")]


class FunctionTool(Body):
    """A function the model may call (only function tools are supported)."""

    type: Literal["function"]
    name: Name
    description: str | None = None
    parameters: Parameters | None = None
    strict: bool | None = None


class ToolChoiceFunction(Body):
    """The one function the model is to call."""

    type: Literal["function"]
    name: Name


Tools = Annotated[list[FunctionTool], Meta(max_length=MAX_TOOLS)]
ToolChoice = Union[
    Annotated[Literal["auto", "none", "required"], Meta(description="required: `tools` must not be empty.")],
    ToolChoiceFunction,
]


class ToolFields(Body):
    """The request fields of this module, read alone (a Chat Completions request's, made into these)."""

    text: TextOptions | None = None
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None


def parse_text(value: Any) -> dict[str, Any]:
    """``text`` (as JSON has it) as the task keeps it."""
    return text_kept(read({"text": value}, ToolFields).text)


def parse_tools(value: Any) -> list[dict[str, Any]]:
    """``tools`` (as JSON has them) as the task keeps them."""
    return tools_kept(read({"tools": value}, ToolFields).tools)


def parse_tool_choice(value: Any, tools: list[dict[str, Any]]) -> Any:
    """``tool_choice`` (as JSON has it) as the task keeps it, given the tools kept."""
    return choice_kept(read({"tool_choice": value}, ToolFields).tool_choice, tools)


def text_kept(text: TextOptions | None) -> dict[str, Any]:
    """``text``: ``{"format": ...}`` as the task keeps it and the Response echoes it."""
    fmt = None if text is None else text.format
    if isinstance(fmt, TextFormatJsonSchema):
        schema = check_schema(fmt.schema, "text.format.schema")
        kept = {"type": "json_schema", "name": fmt.name, "description": fmt.description, "schema": schema}
        return {"format": {**kept, "strict": bool(fmt.strict)}, "verbosity": "medium"}
    kind = "json_object" if isinstance(fmt, TextFormatJsonObject) else "text"
    return {"format": {"type": kind}, "verbosity": "medium"}


def check_schema(schema: dict[str, Any], param: str) -> dict[str, Any]:
    """A JSON Schema object of reasonable size (what it admits is the grammar's to say)."""
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        raise InvalidRequest(f"'{param}' is larger than {MAX_SCHEMA_BYTES} bytes", param=param)
    return schema


def tools_kept(tools: list[FunctionTool] | None) -> list[dict[str, Any]]:
    """``tools`` as the task keeps them and the Response echoes them: each name once,
    each ``parameters`` the schema of an object."""
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools or ()):
        where = f"tools[{i}]"
        if any(t["name"] == tool.name for t in out):
            raise InvalidRequest(f"tool name {tool.name!r} is given twice", param=f"{where}.name")
        given = tool.parameters
        params = EMPTY_PARAMETERS if given is None else check_schema(given, f"{where}.parameters")
        if params.get("type", "object") != "object":
            raise InvalidRequest(
                f"'{where}.parameters' must be the schema of an object (the call's arguments)",
                param=f"{where}.parameters",
            )
        strict = True if tool.strict is None else tool.strict
        kept = {"type": "function", "name": tool.name, "description": tool.description, "parameters": params}
        out.append({**kept, "strict": strict})
    return out


def choice_kept(choice: str | ToolChoiceFunction | None, tools: list[dict[str, Any]]) -> Any:
    """``tool_choice`` as the task keeps it, given the tools kept."""
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice == "required" and not tools:
            raise InvalidRequest("'tool_choice' 'required' needs 'tools'", param="tool_choice")
        return choice
    if not any(t["name"] == choice.name for t in tools):
        raise InvalidRequest(f"'tool_choice' names {choice.name!r}, which is not in 'tools'", param="tool_choice.name")
    return {"type": "function", "name": choice.name}
