"""Function tools, the tool choices that need them, structured output formats and
function-call input items: not done by this service, so refused with a 400
naming the field. What asks for nothing (``tools: []``, ``tool_choice`` "auto" or
"none", ``text.format`` of type "text") is accepted and echoed.

The one place that decides it: :func:`tools_and_format` for the request's fields,
:func:`refuse_item` for an input item.
"""

from __future__ import annotations

from typing import Any, NoReturn

from lmsp.errors import InvalidRequest

from .common import reject_unknown

FIELDS = ("tools", "tool_choice", "text")
TOOL_CALL_ITEMS = ("function_call", "function_call_output")


def _tools(value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest("'tools' must be an array", param="tools")
    for i, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        what = f"tools of type {kind[:64]!r}" if isinstance(kind, str) else "tools"
        raise InvalidRequest(f"{what} are not supported by this service", param=f"tools[{i}]")
    return []


def _tool_choice(value: Any) -> str:
    if value is None:
        return "auto"
    if value in ("auto", "none"):
        return str(value)
    raise InvalidRequest("'tool_choice' can only be 'auto' or 'none': this service runs no tools", param="tool_choice")


def _text(value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"format": {"type": "text"}, "verbosity": "medium"}
    if value is None:
        return out
    if not isinstance(value, dict):
        raise InvalidRequest("'text' must be an object", param="text")
    reject_unknown(value, ("format", "verbosity"), where="text.")
    fmt = value.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict):
            raise InvalidRequest("'text.format' must be an object", param="text.format")
        if fmt.get("type") != "text":
            raise InvalidRequest(
                "'text.format.type' can only be 'text': structured output is not supported by this service",
                param="text.format.type",
            )
        reject_unknown(fmt, ("type",), where="text.format.")
    verbosity = value.get("verbosity")
    if verbosity is not None and verbosity != "medium":
        raise InvalidRequest(
            "'text.verbosity' can only be 'medium' on this service: the model answers at its own length",
            param="text.verbosity",
        )
    return out


def tools_and_format(body: dict[str, Any]) -> dict[str, Any]:
    """``tools``, ``tool_choice`` and ``text`` as the task keeps them; raises InvalidRequest."""
    return {
        "tools": _tools(body.get("tools")),
        "tool_choice": _tool_choice(body.get("tool_choice")),
        "text": _text(body.get("text")),
    }


def refuse_item(kind: str, where: str) -> NoReturn:
    """An input item of a tool call, which this service cannot take."""
    raise InvalidRequest(f"input items of type {kind!r} are not supported by this service", param=f"{where}.type")
