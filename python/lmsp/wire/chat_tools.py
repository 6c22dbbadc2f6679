"""Function tools and structured output of a Chat Completions request: ``tools``,
``tool_choice``, ``response_format``, and the messages that carry calls (an
assistant message's ``tool_calls``, a ``tool`` message), made into what the
Responses API's task keeps (:mod:`lmsp.wire.tools`), so that the same grammar
and the same call format (:mod:`lmsp.calls`) serve both APIs.

Each field is declared in Chat Completions' shape and checked by the Responses
checks; an error names the field as the client sent it (``tools[0].function.name``,
``response_format.json_schema.schema``, and a keyword inside the schema after it).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Iterator, Literal

from msgspec import Meta

from lmsp import history
from lmsp.errors import InvalidRequest

from . import tools
from .structs import Body, Name

FORMAT_PARAM = "response_format.json_schema"
# what the runtime's refusal of a schema names (lmsp.runtime.constraints), or the start of
# it (a keyword inside the schema) -> the chat request's name
SCHEMA_PARAMS = {"text.format.schema": f"{FORMAT_PARAM}.schema"}
TOOL_PARAMETERS = re.compile(r"^tools\[\d+\]\.parameters(?=$|[.\[])")

CallId = Annotated[str, Meta(min_length=1, max_length=tools.MAX_CALL_ID)]


class ChatFunction(Body):
    """A function the model may call: its name, what it does, the schema of its arguments."""

    name: Name
    description: str | None = None
    parameters: (
        Annotated[dict[str, Any], Meta(description="The schema of the call's arguments (an object).")] | None
    ) = None
    strict: bool | None = None


class ChatTool(Body):
    """A tool of the request: a function (the only kind this service has)."""

    type: Literal["function"]
    function: ChatFunction


class ChatToolChoiceFunction(Body):
    """The function a call must be made to."""

    name: Name


class ChatToolChoice(Body):
    """A call to this function, and no other answer."""

    type: Literal["function"]
    function: ChatToolChoiceFunction


ToolChoice = Annotated[
    Literal["auto", "none", "required"] | ChatToolChoice,
    Meta(description="required: `tools` must not be empty."),
]


class ChatResponseFormatText(Body, tag_field="type", tag="text"):
    """Text, as the model writes it."""


class ChatResponseFormatJsonObject(Body, tag_field="type", tag="json_object"):
    """A JSON object."""


class ChatJsonSchema(Body):
    """The schema the output is held to (by a grammar), and its name."""

    name: Name
    schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None


class ChatResponseFormatJsonSchema(Body, tag_field="type", tag="json_schema"):
    """JSON that a schema admits."""

    json_schema: ChatJsonSchema


ResponseFormat = Annotated[
    ChatResponseFormatText | ChatResponseFormatJsonObject | ChatResponseFormatJsonSchema,
    Meta(
        description="A schema the grammar cannot hold the output to: 400 "
        "(`response_format.json_schema.schema`). With `logprobs`, each token's are over the tokens "
        "the grammar allows."
    ),
]


class ChatToolCallFunction(Body):
    """The function called and its arguments (JSON text)."""

    name: Name
    arguments: str


class ChatToolCall(Body):
    """A call an assistant message made earlier."""

    id: CallId
    function: ChatToolCallFunction
    type: Literal["function"] = "function"


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


def parse_response_format(value: ResponseFormat | None) -> dict[str, Any]:
    """``response_format`` as the task's ``text`` field keeps it (the schema's size checked)."""
    if value is None:
        return tools.parse_text(None)
    if not isinstance(value, ChatResponseFormatJsonSchema):
        kind = "text" if isinstance(value, ChatResponseFormatText) else "json_object"
        return tools.parse_text({"format": {"type": kind}})
    given = value.json_schema
    fmt: dict[str, Any] = {"type": "json_schema", "name": given.name, "schema": given.schema}
    fmt.update(description=given.description, strict=given.strict)
    try:
        return tools.parse_text({"format": fmt})
    except InvalidRequest as exc:
        raise renamed(exc, "text.format", FORMAT_PARAM) from None


def parse_tool_fields(given: list[ChatTool] | None, choice: ToolChoice | None) -> dict[str, Any]:
    """``tools`` and ``tool_choice`` as the task keeps them (names unique, each
    ``parameters`` the schema of an object, a chosen function one of ``tools``)."""
    flat = None if given is None else [_flat(t.function) for t in given]
    try:
        parsed = tools.parse_tools(flat)
    except InvalidRequest as exc:  # tools[i].name, tools[i].parameters...: inside its function
        param = exc.param or ""
        if "." not in param:
            raise
        head = param.split(".", 1)[0]
        raise renamed(exc, head, f"{head}.function") from None
    chosen = choice if isinstance(choice, str) or choice is None else {"type": "function", "name": choice.function.name}
    try:
        return {"tools": parsed, "tool_choice": tools.parse_tool_choice(chosen, parsed)}
    except InvalidRequest as exc:
        raise renamed(exc, "tool_choice.name", "tool_choice.function.name") from None


def _flat(function: ChatFunction) -> dict[str, Any]:
    """A chat tool's function as a Responses tool."""
    out: dict[str, Any] = {"type": "function", "name": function.name, "description": function.description}
    out.update(parameters=function.parameters, strict=function.strict)
    return out


def tool_call_messages(calls: list[ChatToolCall], where: str, seen: dict[str, str]) -> Iterator[dict[str, str]]:
    """An assistant message's ``tool_calls``, each as a call message
    (:mod:`lmsp.history`), as the Responses API keeps a ``function_call`` item;
    ``seen`` maps the call ids so far to their names. A call's id is unique in the
    messages (a tool message answers one call) and its ``arguments`` are JSON text."""
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        if call.id in seen:
            raise InvalidRequest(
                f"'{at}.id' {call.id[:100]!r} is the id of a tool call before it: each call's id must be unique",
                param=f"{at}.id",
            )
        _check_json(call.function.arguments, f"{at}.function.arguments")
        seen[call.id] = call.function.name
        yield history.call_message(call.function.name, call.function.arguments, call.id)


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


def tool_message(call_id: str, where: str, text: str, seen: dict[str, str]) -> dict[str, str]:
    """A ``tool`` message (``text``: its content) answering the call ``call_id``, as a
    call's output (:mod:`lmsp.history`), as the Responses API keeps a
    ``function_call_output`` item."""
    if call_id not in seen:
        raise InvalidRequest(
            f"'{where}.tool_call_id' {call_id[:100]!r} matches no tool call of an assistant message before it",
            param=f"{where}.tool_call_id",
        )
    return history.output_message(seen[call_id], call_id, text)


def stored_message(
    role: str, text: str, calls: list[ChatToolCall] | None = None, call_id: str | None = None
) -> dict[str, Any]:
    """A checked message as a stored completion lists it, as OpenAI does: ``role``, its
    content as one text (null for an assistant's calls without text), an assistant's
    ``tool_calls`` and a tool message's ``tool_call_id`` as the client sent them."""
    out: dict[str, Any] = {"role": role, "content": None if calls and not text else text}
    if calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in calls
        ]
    if call_id is not None:
        out["tool_call_id"] = call_id
    return out
