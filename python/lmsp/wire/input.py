"""A request's input as the prompt reads it: messages and input items (LMSP B.5),
content parts as one text, function calls and their outputs, reasoning; and
the limits every endpoint's input shares.

Each input item is its own wire type, told apart by its ``type`` (a message may
omit it): :func:`input_item` reads one item as the type it names.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union

import msgspec
from msgspec import Meta

from lmsp import history
from lmsp.errors import InvalidRequest

from .options import explained
from .structs import JSON, NO_NUL, REF, Body, Name, refusal
from .tools import MAX_CALL_ID

ROLE_ALIASES = {"developer": "system"}  # the OpenAI name of a system message
SEED_MAX = 2**32 - 2  # 2**32 - 1 is llama.cpp's "pick one at random"
MAX_MESSAGES = 10_000
MAX_TEXT = 4_000_000  # characters in one message; the body cap comes first anyway
MAX_STOP = 16

Text = Annotated[str, Meta(max_length=MAX_TEXT, pattern=NO_NUL)]
CallId = Annotated[str, Meta(min_length=1, max_length=MAX_CALL_ID)]

#: why a content part's type is refused
REASONS = {
    "content[].type": "only text content is supported: the models of this service have no projector"
    " for images, audio, video or files",
}


# a part's text: NUL is refused in the message's text (param: its content)
PartText = Annotated[str, Meta(max_length=MAX_TEXT)]
_NO_NUL: JSON = {"type": "string", "maxLength": MAX_TEXT, "pattern": NO_NUL}


class _TextPart(Body, tag_field="type"):
    text: PartText
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None

    __schema__: ClassVar[JSON] = {"properties": {"text": _NO_NUL}}


class InputTextPart(_TextPart, tag="input_text"):
    """A text part of a message."""


class OutputTextPart(_TextPart, tag="output_text"):
    """A text part of an earlier output message, as the SDKs echo it (its annotations and logprobs are not read)."""


class PlainTextPart(_TextPart, tag="text"):
    """A text part of a message."""


class RefusalPart(Body, tag_field="type", tag="refusal"):
    """An assistant's refusal in an earlier output message: read as its text."""

    refusal: PartText

    __schema__: ClassVar[JSON] = {"properties": {"refusal": _NO_NUL}}


Part = Union[InputTextPart, OutputTextPart, PlainTextPart, RefusalPart]


class InputMessage(Body):
    """A message: its role (``developer`` is ``system``) and its content, a text or text
    parts. The ``id``, ``status`` and ``phase`` of an output message echoed back are taken and not read."""

    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[str, Meta(pattern=NO_NUL)] | list[Part]
    type: Literal["message"] = "message"
    id: Annotated[str, Meta(max_length=256)] | None = None
    status: str | None = None
    phase: str | None = None


class InputReasoning(Body):
    """The reasoning of an earlier output: its ``content`` text is shown again to a
    template that shows reasoning; a summary or encrypted content adds nothing to the prompt."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] | None = None
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: str | None = None


class InputFunctionCall(Body):
    """A function call of an earlier output."""

    type: Literal["function_call"]
    call_id: CallId
    name: Name
    arguments: str
    id: str | None = None
    status: str | None = None


_OUTPUT_PARTS: JSON = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"type": {"enum": ["input_text", "text"]}, "text": {"type": "string"}},
        "required": ["type", "text"],
    },
}


class InputFunctionCallOutput(Body):
    """The output of a function call before it (in the input, or in the turns it continues):
    a text, or text parts."""

    type: Literal["function_call_output"]
    call_id: CallId
    output: str | list[Any]
    id: str | None = None
    status: str | None = None

    __schema__: ClassVar[JSON] = {"properties": {"output": {"anyOf": [{"type": "string"}, _OUTPUT_PARTS]}}}


Item = Union[InputMessage, InputReasoning, InputFunctionCall, InputFunctionCallOutput]
#: each input item's wire type, by its ``type``
ITEMS: dict[str, type[Item]] = {
    "message": InputMessage,
    "reasoning": InputReasoning,
    "function_call": InputFunctionCall,
    "function_call_output": InputFunctionCallOutput,
}
#: the schema of an input item, for the wire types that hold items
ITEM_SCHEMA: JSON = {"anyOf": [{"$ref": REF.format(name=kind.__name__)} for kind in ITEMS.values()]}


def check_nul(text: str, param: str) -> str:
    if "\x00" in text:  # no chat template or tokenizer takes it
        raise InvalidRequest(f"{param!r} must not contain NUL characters", param=param)
    return text


def parse_messages(value: str | list[Any], calls: dict[str, str] | None = None) -> list[dict[str, str]]:
    """``input`` as its wire type holds it (a string: one user message; or input items)
    as the prompt's messages; ``calls``: the function calls so far (call id -> name),
    those of the input added."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    messages = []
    calls = {} if calls is None else calls
    for i, item in enumerate(value):
        message = input_item(item, f"input[{i}]", calls)
        if message is not None:
            messages.append(message)
    if all(history.is_reasoning(m) for m in messages):
        raise InvalidRequest("'input' has no message", param="input")
    return messages


def input_item(item: Any, where: str, calls: dict[str, str]) -> dict[str, str] | None:
    """One input item: a message as the prompt takes it, or None for an item that adds
    nothing to the prompt (a reasoning item without its text);
    ``calls`` maps the call ids of the function calls so far to their names."""
    kind = item.get("type", "message") if isinstance(item, dict) else "message"
    if not isinstance(kind, str) or kind not in ITEMS:
        raise InvalidRequest(
            f"{where}.type must be 'message', 'reasoning', 'function_call' or 'function_call_output';"
            " other input items are not supported",
            param=f"{where}.type",
        )
    try:  # its body was read (its numbers as JSON has them): the item is only converted
        asked = msgspec.convert(item, ITEMS[kind])
    except msgspec.ValidationError as e:
        raise explained(refusal(e, where, item, ITEMS[kind]), REASONS, where) from None
    if isinstance(asked, InputMessage):
        content = asked.content
        if not isinstance(content, str):
            content = check_nul(_parts_text(content), f"{where}.content")
        return {"role": ROLE_ALIASES.get(asked.role, asked.role), "content": content}
    if isinstance(asked, InputReasoning):  # the model's earlier thinking: for a template that shows it again
        text = check_nul(history.reasoning_text({"content": asked.content}), f"{where}.content")
        return history.reasoning_message(text) if text else None  # a summary only, or encrypted: nothing
    return call_message(asked, where, calls)


def _parts_text(content: list[Part]) -> str:
    return "".join(part.refusal if isinstance(part, RefusalPart) else part.text for part in content)


def call_message(
    item: InputFunctionCall | InputFunctionCallOutput, where: str, calls: dict[str, str]
) -> dict[str, str]:
    """A function call or its output as the chat message the model reads
    (:mod:`lmsp.history`); ``calls`` maps the call ids of the calls so far to their names."""
    if isinstance(item, InputFunctionCall):
        calls[item.call_id] = item.name
        return history.call_message(item.name, item.arguments, item.call_id)
    if item.call_id not in calls:
        raise InvalidRequest(
            f"'{where}.call_id' {item.call_id!r} matches no function_call before it", param=f"{where}.call_id"
        )
    output = item.output
    if isinstance(output, list):
        parts: list[str] = [p["text"] for p in output if _is_text(p)]
        if len(parts) != len(output):
            raise InvalidRequest(f"'{where}.output' must be a string or text parts", param=f"{where}.output")
        output = "".join(parts)
    return history.output_message(calls[item.call_id], item.call_id, output)


def _is_text(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in ("input_text", "text") and isinstance(part.get("text"), str)


def parse_stop(value: Any) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise InvalidRequest("'stop' must be a string or an array of strings", param="stop")
    if len(items) > MAX_STOP:
        raise InvalidRequest(f"'stop' has more than {MAX_STOP} strings", param="stop")
    for s in items:
        if not isinstance(s, str) or not s or len(s) > 1000:
            raise InvalidRequest(
                "each stop sequence must be a non-empty string of at most 1000 characters", param="stop"
            )
    return list(items)
