"""A request's input as the prompt reads it: messages and input items (LMSP B.5),
content parts as one text, function calls and their outputs, reasoning; and
the limits every endpoint's input shares."""

from __future__ import annotations

from typing import Any

from lmsp import history
from lmsp.errors import InvalidRequest

from . import tools
from .fields import get_str, reject_unknown

ROLES = ("system", "user", "assistant")
ROLE_ALIASES = {"developer": "system"}  # the OpenAI name of a system message
TEXT_PART_TYPES = ("input_text", "output_text", "text")
MEDIA_PART_TYPES = ("input_image", "input_file", "input_audio", "input_video")
REASONING_FIELDS = ("type", "id", "summary", "content", "encrypted_content", "status")
SEED_MAX = 2**32 - 2  # 2**32 - 1 is llama.cpp's "pick one at random"
MAX_MESSAGES = 10_000
MAX_TEXT = 4_000_000  # characters in one message; the body cap comes first anyway
MAX_STOP = 16


def _part_text(part: dict[str, Any], where: str) -> str:
    """One content part's text: text parts as the SDKs send and echo them (an output's
    annotations and logprobs included), a refusal's words; media is refused."""
    kind = part.get("type")
    if kind in MEDIA_PART_TYPES:
        raise InvalidRequest(
            f"{where}.type {kind!r} is not supported: the models of this service have no projector"
            " for images, audio, video or files",
            param=f"{where}.type",
        )
    if kind == "refusal":
        reject_unknown(part, ("type", "refusal"), where=f"{where}.")
        return str(
            get_str(part, "refusal", required=True, allow_empty=True, max_len=MAX_TEXT, param=f"{where}.refusal")
        )
    if kind not in TEXT_PART_TYPES:
        raise InvalidRequest(
            f"{where}.type must be one of {', '.join(TEXT_PART_TYPES)}; only text content is supported",
            param=f"{where}.type",
        )
    reject_unknown(part, ("type", "text", "annotations", "logprobs"), where=f"{where}.")
    _check_types(part, {"annotations": list, "logprobs": list}, where)
    return str(get_str(part, "text", required=True, allow_empty=True, max_len=MAX_TEXT, param=f"{where}.text"))


def _check_types(item: dict[str, Any], types: dict[str, type], where: str) -> None:
    """The optional fields of an input item or part that must be null or of a type."""
    for name, kind in types.items():
        value = item.get(name)
        if value is not None and not isinstance(value, kind):
            what = "a string" if kind is str else "an array"
            raise InvalidRequest(f"{where}.{name} must be {what} or null", param=f"{where}.{name}")


def _content_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            where = f"{param}[{j}]"
            if not isinstance(part, dict):
                raise InvalidRequest(f"{where!r} must be an object", param=where)
            texts.append(_part_text(part, where))
        return "".join(texts)
    raise InvalidRequest(f"{param!r} must be a string or an array of text parts", param=param)


def check_nul(text: str, param: str) -> str:
    if "\x00" in text:  # no chat template or tokenizer takes it
        raise InvalidRequest(f"{param!r} must not contain NUL characters", param=param)
    return text


def parse_messages(value: Any, calls: dict[str, str] | None = None) -> list[dict[str, str]]:
    """``input``: a string (one user message) or a list of messages; ``calls``: the
    function calls so far (call id -> name), those of the input added."""
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise InvalidRequest(f"'input' is longer than {MAX_TEXT} characters", param="input")
        return [{"role": "user", "content": check_nul(value, "input")}]
    if not isinstance(value, list):
        raise InvalidRequest("'input' must be a string or an array of messages", param="input")
    if not value:
        raise InvalidRequest("'input' must not be an empty array", param="input")
    if len(value) > MAX_MESSAGES:
        raise InvalidRequest(f"'input' has more than {MAX_MESSAGES} messages", param="input")
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
    if not isinstance(item, dict):
        raise InvalidRequest(f"{where} must be an object with 'role' and 'content'", param=where)
    kind = item.get("type", "message")
    if kind in tools.CALL_ITEMS:
        return tools.call_message(item, where, calls)
    if kind == "reasoning":  # the model's earlier thinking: for a template that shows it again
        reject_unknown(item, REASONING_FIELDS, where=f"{where}.")
        _check_types(
            item, {"id": str, "summary": list, "content": list, "encrypted_content": str, "status": str}, where
        )
        text = check_nul(history.reasoning_text(item), f"{where}.content")
        return history.reasoning_message(text) if text else None  # a summary only, or encrypted: nothing
    if kind != "message":
        raise InvalidRequest(
            f"{where}.type must be 'message', 'reasoning', 'function_call' or 'function_call_output';"
            " other input items are not supported",
            param=f"{where}.type",
        )
    # id, status and phase: what the SDKs echo of an output message; nothing of the prompt
    reject_unknown(item, ("role", "content", "type", "id", "status", "phase"), where=f"{where}.")
    get_str(item, "id", max_len=256, allow_empty=True, param=f"{where}.id")
    _check_types(item, {"status": str, "phase": str}, where)
    role = item.get("role")
    role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
    if role not in ROLES:
        raise InvalidRequest(f"{where}.role must be one of {', '.join(ROLES)}", param=f"{where}.role")
    if "content" not in item or item["content"] is None:
        raise InvalidRequest(f"{where}.content is required", param=f"{where}.content")
    text = _content_text(item["content"], f"{where}.content")
    return {"role": role, "content": check_nul(text, f"{where}.content")}


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
