"""Function tools and structured output of a Chat Completions request: ``tools``,
``tool_choice``, ``response_format``, and the messages that carry calls (an
assistant message's ``tool_calls``, a ``tool`` message), made into what the
Responses API's task keeps (:mod:`lmsp.wire.tools`), so that the same grammar
and the same call format (:mod:`lmsp.calls`) serve both APIs.

Each field is read in Chat Completions' shape and checked by the Responses
checks; an error names the field as the client sent it (``tools[0].function.name``,
``response_format.json_schema.schema``, and a keyword inside the schema after it).
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

from lmsp import history
from lmsp.errors import InvalidRequest

from . import tools
from .fields import get_str, reject_unknown

FORMAT_PARAM = "response_format.json_schema"
# what the runtime's refusal of a schema names (lmsp.runtime.constraints), or the start of
# it (a keyword inside the schema) -> the chat request's name
SCHEMA_PARAMS = {"text.format.schema": f"{FORMAT_PARAM}.schema"}
TOOL_PARAMETERS = re.compile(r"^tools\[\d+\]\.parameters(?=$|[.\[])")


def renamed(exc: InvalidRequest, old: str, new: str) -> InvalidRequest:
    """``exc`` with ``old`` (a param's prefix) named ``new`` in its param and message."""
    param = exc.param or ""
    if not param.startswith(old):
        return exc
    out = InvalidRequest(exc.message.replace(old, new), param=new + param[len(old) :])
    out.code = exc.code
    return out


def chat_param(exc: InvalidRequest) -> InvalidRequest:
    """A refusal of the task's request (the runtime checks its schemas) with the param
    named as the chat request names it."""
    param = exc.param or ""
    for old, new in SCHEMA_PARAMS.items():
        if param == old or param.startswith((old + ".", old + "[")):
            return renamed(exc, old, new)
    tool = TOOL_PARAMETERS.match(param)
    if tool:
        return renamed(exc, tool.group(0), tool.group(0).replace(".parameters", ".function.parameters"))
    return exc


def parse_response_format(value: Any) -> dict[str, Any]:
    """``response_format`` as the task's ``text`` field keeps it."""
    if value is None:
        return tools.parse_text(None)
    if not isinstance(value, dict):
        raise InvalidRequest("'response_format' must be an object", param="response_format")
    kind = value.get("type")
    if kind not in tools.FORMAT_TYPES:
        raise InvalidRequest(
            f"'response_format.type' must be one of {', '.join(tools.FORMAT_TYPES)}", param="response_format.type"
        )
    if kind != "json_schema":
        reject_unknown(value, ("type",), where="response_format.")
        return tools.parse_text({"format": {"type": kind}})
    reject_unknown(value, ("type", "json_schema"), where="response_format.")
    given = value.get("json_schema")
    if not isinstance(given, dict):
        raise InvalidRequest(f"'{FORMAT_PARAM}' must be an object", param=FORMAT_PARAM)
    reject_unknown(given, ("name", "schema", "description", "strict"), where=f"{FORMAT_PARAM}.")
    try:
        return tools.parse_text({"format": {**given, "type": "json_schema"}})
    except InvalidRequest as exc:
        raise renamed(exc, "text.format", FORMAT_PARAM) from None


def _function(tool: Any, where: str) -> dict[str, Any]:
    """One chat tool (``{"type": "function", "function": {...}}``) as a Responses tool."""
    if not isinstance(tool, dict):
        raise InvalidRequest(f"'{where}' must be an object", param=where)
    if tool.get("type") != "function":
        raise InvalidRequest(
            f"'{where}.type' must be 'function': only function tools are supported", param=f"{where}.type"
        )
    reject_unknown(tool, ("type", "function"), where=f"{where}.")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise InvalidRequest(f"'{where}.function' must be an object", param=f"{where}.function")
    reject_unknown(function, ("name", "description", "parameters", "strict"), where=f"{where}.function.")
    return {**function, "type": "function"}


def parse_tool_fields(body: dict[str, Any]) -> dict[str, Any]:
    """``tools`` and ``tool_choice`` as the task keeps them."""
    given = body.get("tools")
    flat = [_function(t, f"tools[{i}]") for i, t in enumerate(given)] if isinstance(given, list) else given
    try:
        parsed = tools.parse_tools(flat)
    except InvalidRequest as exc:
        param = exc.param or ""
        head = param.split(".", 1)[0]
        if "." in param and not param.endswith(".type"):
            raise renamed(exc, head, f"{head}.function") from None
        raise
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        reject_unknown(choice, ("type", "function"), where="tool_choice.")
        function = choice.get("function")
        if choice.get("type") != "function" or not isinstance(function, dict):
            raise InvalidRequest(
                '\'tool_choice\' must be auto, none, required or {"type": "function", "function": {"name"}}',
                param="tool_choice",
            )
        reject_unknown(function, ("name",), where="tool_choice.function.")
        choice = {"type": "function", "name": function.get("name")}
    try:
        return {"tools": parsed, "tool_choice": tools.parse_tool_choice(choice, parsed)}
    except InvalidRequest as exc:
        raise renamed(exc, "tool_choice.name", "tool_choice.function.name") from None


def tool_call_messages(calls_given: Any, where: str, seen: dict[str, str]) -> Iterator[dict[str, str]]:
    """An assistant message's ``tool_calls``, each as a call message
    (:mod:`lmsp.history`), as the Responses API keeps a ``function_call`` item;
    ``seen`` maps the call ids so far to their names. A call's id is unique in the
    messages (a tool message answers one call) and its ``arguments`` are JSON text."""
    if not isinstance(calls_given, list):
        raise InvalidRequest(f"'{where}' must be an array", param=where)
    for j, call in enumerate(calls_given):
        at = f"{where}[{j}]"
        if not isinstance(call, dict):
            raise InvalidRequest(f"'{at}' must be an object", param=at)
        reject_unknown(call, ("id", "type", "function"), where=f"{at}.")
        if call.get("type", "function") != "function":
            raise InvalidRequest(f"'{at}.type' must be 'function'", param=f"{at}.type")
        call_id = get_str(call, "id", required=True, max_len=tools.MAX_CALL_ID, param=f"{at}.id")
        if call_id in seen:
            raise InvalidRequest(
                f"'{at}.id' {call_id[:100]!r} is the id of a tool call before it: each call's id must be unique",
                param=f"{at}.id",
            )
        function = call.get("function")
        if not isinstance(function, dict):
            raise InvalidRequest(f"'{at}.function' must be an object", param=f"{at}.function")
        reject_unknown(function, ("name", "arguments"), where=f"{at}.function.")
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str) or not tools.NAME.fullmatch(name):
            raise InvalidRequest(f"'{at}.function.name' must be a function name", param=f"{at}.function.name")
        if not isinstance(arguments, str):
            raise InvalidRequest(f"'{at}.function.arguments' must be a string", param=f"{at}.function.arguments")
        _check_json(arguments, f"{at}.function.arguments")
        seen[str(call_id)] = name
        yield history.call_message(name, arguments, str(call_id))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_json(text: str, param: str) -> None:
    """InvalidRequest naming ``param`` unless ``text`` is JSON text (NaN and Infinity are not)."""
    try:
        json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise InvalidRequest(f"'{param}' must be JSON text: {exc}", param=param) from None
    except RecursionError:
        raise InvalidRequest(f"'{param}' nests too deeply", param=param) from None


def tool_message(message: dict[str, Any], where: str, text: str, seen: dict[str, str]) -> dict[str, str]:
    """A ``tool`` message (``text``: its content) as a call's output (:mod:`lmsp.history`),
    as the Responses API keeps a ``function_call_output`` item."""
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidRequest(f"'{where}.tool_call_id' is required", param=f"{where}.tool_call_id")
    if call_id not in seen:
        raise InvalidRequest(
            f"'{where}.tool_call_id' {call_id[:100]!r} matches no tool call of an assistant message before it",
            param=f"{where}.tool_call_id",
        )
    return history.output_message(seen[call_id], call_id, text)


def stored_message(message: dict[str, Any], role: str, text: str) -> dict[str, Any]:
    """A checked message as a stored completion lists it, as OpenAI does: ``role``, its
    content as one text (null for an assistant's calls without text), an assistant's
    ``tool_calls`` and a tool message's ``tool_call_id`` as the client sent them."""
    calls_given = message.get("tool_calls") or []
    out: dict[str, Any] = {"role": role, "content": None if calls_given and not text else text}
    if calls_given:
        out["tool_calls"] = [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]},
            }
            for call in calls_given
        ]
    if role == "tool":
        out["tool_call_id"] = message["tool_call_id"]
    return out
