"""The objects the conversation endpoints answer with (LMSP B.11): conversations
and their items (also a response's input items).

They declare the answers' schemas in the OpenAPI document; the service renders
its answers from its rows.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from .answers import Deleted, Page
from .structs import Answer, Time


class Item(Answer):
    """An item of a conversation or of a response's input: its other fields are those of its `type`."""

    id: str
    type: Literal["message", "function_call", "function_call_output", "reasoning"]


class ItemList(Page):
    """A page of items."""

    data: list[Item]


class Conversation(Answer):
    """A conversation: the items of its turns, and its metadata."""

    id: Annotated[str, Meta(pattern="^conv_")]
    object: Literal["conversation"]
    created_at: Time
    metadata: dict[str, str]


class DeletedConversation(Answer):
    """A conversation deleted with its items."""

    id: str
    object: Literal["conversation.deleted"]
    deleted: Deleted


#: the answers of the conversation endpoints, as the OpenAPI document names them
ANSWERS = (Item, ItemList, Conversation, DeletedConversation)
