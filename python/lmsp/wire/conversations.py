"""The requests on conversations (LMSP B.11): their wire types, and the items a
client adds, checked as a response's input is, as the list keeps them."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from msgspec import Meta

from lmsp.ids import new_id
from lmsp.items.listed import listed_item

from .input import ITEM_SCHEMA, input_item
from .structs import JSON, Body, Metadata, read

MAX_ITEMS = 20  # items in one request, as OpenAI's API
_ITEMS: JSON = {"type": "array", "maxItems": MAX_ITEMS, "items": ITEM_SCHEMA}


class CreateConversation(Body):
    """A new conversation: its first items (at most 20) and its metadata."""

    items: Annotated[list[Any], Meta(max_length=MAX_ITEMS)] | None = None
    metadata: Metadata | None = None

    __schema__: ClassVar[JSON] = {"properties": {"items": {"anyOf": [_ITEMS, {"type": "null"}]}}}


class UpdateConversation(Body):
    """A conversation's new metadata, which replaces its metadata."""

    metadata: Metadata


class AddConversationItems(Body):
    """Items (1 to 20) to add at the end of a conversation."""

    items: Annotated[list[Any], Meta(min_length=1, max_length=MAX_ITEMS)]

    __schema__: ClassVar[JSON] = {"properties": {"items": {**_ITEMS, "minItems": 1}}}


def parse_new(body: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """A new conversation's items, as the list keeps them, and its metadata."""
    asked = read(body, CreateConversation)
    return parse_items(asked.items or []), asked.metadata or {}


def parse_update(body: dict[str, Any]) -> dict[str, str]:
    """A conversation's new metadata."""
    return read(body, UpdateConversation).metadata


def read_added(body: dict[str, Any]) -> list[Any]:
    """The items to add, before they are checked (:func:`parse_items`)."""
    return read(body, AddConversationItems).items


def parse_items(items: list[Any], calls: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """``items``: input items (messages, function calls and their outputs, reasoning),
    checked as a response's input is, as the list keeps them: a ``function_call_output``
    answers a call before it, in ``items`` or in ``calls`` (call id -> name: those of
    the conversation the items go to)."""
    known = dict(calls or {})
    out = []
    for i, item in enumerate(items):
        input_item(item, f"items[{i}]", known)
        out.append(listed_item(item, new_id))
    return out


def answers_calls(items: list[Any]) -> bool:
    """Whether ``items`` holds a ``function_call_output`` (whose call may be in the
    conversation already)."""
    return any(isinstance(item, dict) and item.get("type") == "function_call_output" for item in items)
