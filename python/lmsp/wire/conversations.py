"""The items a client adds to a conversation (LMSP B.11), checked as a response's
input is, as the list keeps them."""

from __future__ import annotations

from typing import Any

from lmsp.errors import InvalidRequest
from lmsp.ids import new_id
from lmsp.items.listed import listed_item

from .input import input_item


MAX_ITEMS = 20  # items in one request, as OpenAI's API


def parse_items(value: Any, *, required: bool, calls: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """``items``: up to :data:`MAX_ITEMS` input items (messages, function calls and their
    outputs, reasoning), checked as a response's input is, as the list keeps them: a
    ``function_call_output`` answers a call before it, in ``items`` or in ``calls`` (call
    id -> name: those of the conversation the items go to)."""
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        raise InvalidRequest(
            "'items' must be a non-empty array of items" if required else "'items' must be an array", param="items"
        )
    if len(value) > MAX_ITEMS:
        raise InvalidRequest(f"'items' has more than {MAX_ITEMS} items", param="items")
    known = dict(calls or {})
    out = []
    for i, item in enumerate(value):
        input_item(item, f"items[{i}]", known)
        out.append(listed_item(item, new_id))
    return out


def answers_calls(value: Any) -> bool:
    """Whether ``items`` holds a ``function_call_output`` (whose call may be in the
    conversation already)."""
    return isinstance(value, list) and any(
        isinstance(item, dict) and item.get("type") == "function_call_output" for item in value
    )
