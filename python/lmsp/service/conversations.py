"""Conversations (LMSP B.11): a client's list of items, which a response created
with ``conversation`` reads as its context and to which it appends its turn
(:mod:`lmsp.store.conversations`). Items added while a turn runs are refused
(``conversation_busy``), so the list stays in the order the model saw it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .turns import item_messages

if TYPE_CHECKING:
    from lmsp.store import Store


class ConversationService:
    """Creating, reading, changing and deleting conversations and their items."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def create(self, client_id: str, metadata: dict[str, str], items: list[dict[str, Any]]) -> dict[str, Any]:
        return self.store.create_conversation(client_id, metadata, items)

    def get(self, conversation_id: str, owner: str | None) -> dict[str, Any]:
        return self.store.get_conversation(conversation_id, owner)

    def update(self, conversation_id: str, metadata: dict[str, str], owner: str | None) -> dict[str, Any]:
        return self.store.update_conversation(conversation_id, metadata, owner)

    def delete(self, conversation_id: str, owner: str | None) -> dict[str, Any]:
        return self.store.delete_conversation(conversation_id, owner)

    def items(self, conversation_id: str, owner: str | None, **page: Any) -> dict[str, Any]:
        """A page of the conversation's items."""
        return self.store.list_conversation_items(conversation_id, owner, **page)

    def calls(self, conversation_id: str, owner: str | None) -> tuple[dict[str, str], int]:
        """The function calls made in the conversation (call id -> name), as a response
        reads them, and the version of the list they were read at."""
        stored, version = self.store.conversation_items(conversation_id, owner)
        return item_messages(stored)[1], version

    def add_items(
        self, conversation_id: str, items: list[dict[str, Any]], owner: str | None, version: int | None
    ) -> dict[str, Any]:
        """Append items; ``version``: the list's version their calls were checked against
        (refused if it changed since), None when none was read."""
        return self.store.add_conversation_items(conversation_id, items, owner, version=version)

    def item(self, conversation_id: str, item_id: str, owner: str | None) -> dict[str, Any]:
        return self.store.get_conversation_item(conversation_id, item_id, owner)

    def delete_item(self, conversation_id: str, item_id: str, owner: str | None) -> dict[str, Any]:
        """Delete an item; the conversation."""
        return self.store.delete_conversation_item(conversation_id, item_id, owner)
