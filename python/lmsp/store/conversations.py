"""Conversations (LMSP B.11): a client's list of items that responses read as
their context and append their turns to.

A response created with a conversation takes it (``busy_task``) in the
transaction that creates its task: one response in progress per conversation,
and no item added meanwhile (the model did not see it: it cannot go before the
turn, nor among the items the turn was made from).
Its turn (input items, then output items) is appended, and the conversation
freed, in the transaction of its terminal event (:func:`append_turn`, called by
every final transition), so a crash never appends half a turn or a turn twice.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import NotFound
from .base import StoreBase, dumps
from .items import CONVERSATION_LIST, item_page
from .turns import append_items, changed, check_free, conversation_object, row_of


class ConversationsArea(StoreBase):
    """Creating, reading, changing and deleting conversations and their items."""

    def create_conversation(
        self, client_id: str | None, metadata: dict[str, str], items: list[dict[str, Any]]
    ) -> dict[str, Any]:
        with self._db.write() as conn:
            now = self._clock()
            cid = self._new_id("conv")
            conn.execute(
                "INSERT INTO conversations (id, client_id, created_at, metadata) VALUES (?,?,?,?)",
                (cid, client_id, now, dumps(metadata)),
            )
            append_items(conn, cid, items, now)
            return conversation_object(row_of(conn, cid, None))

    def get_conversation(self, conversation_id: str, client_id: str | None = None) -> dict[str, Any]:
        with self._db.read() as conn:
            return conversation_object(row_of(conn, conversation_id, client_id))

    def update_conversation(
        self, conversation_id: str, metadata: dict[str, str], client_id: str | None = None
    ) -> dict[str, Any]:
        with self._db.write() as conn:
            row_of(conn, conversation_id, client_id)
            conn.execute("UPDATE conversations SET metadata = ? WHERE id = ?", (dumps(metadata), conversation_id))
            return conversation_object(row_of(conn, conversation_id, None))

    def delete_conversation(self, conversation_id: str, client_id: str | None = None) -> dict[str, Any]:
        """Delete a conversation with its items (a response in progress on it ends
        without appending its turn)."""
        with self._db.write() as conn:
            row_of(conn, conversation_id, client_id)
            conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))  # cascades to its items
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    def conversation_items(
        self, conversation_id: str, client_id: str | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """Every item of a conversation, in order (a response's context), and the
        conversation's version they were read at."""
        with self._db.read() as conn:
            version = row_of(conn, conversation_id, client_id)["version"]
            rows = conn.execute(
                "SELECT data FROM conversation_items WHERE conversation_id = ? ORDER BY pos", (conversation_id,)
            ).fetchall()
        return [json.loads(r[0]) for r in rows], int(version)

    def list_conversation_items(
        self,
        conversation_id: str,
        client_id: str | None = None,
        *,
        after: str | None = None,
        before: str | None = None,
        limit: int = 20,
        order: str = "desc",
    ) -> dict[str, Any]:
        with self._db.read() as conn:
            row_of(conn, conversation_id, client_id)
            return item_page(
                conn, CONVERSATION_LIST, conversation_id, after=after, before=before, limit=limit, order=order
            )

    def add_conversation_items(
        self,
        conversation_id: str,
        items: list[dict[str, Any]],
        client_id: str | None = None,
        *,
        version: int | None = None,
    ) -> dict[str, Any]:
        """Append items; the list of those added. ConversationBusy while a response of the
        conversation is in progress: its turn, which the model made without these items,
        goes first. With ``version`` (the one the items were checked against: the calls
        their outputs answer), also when the conversation changed since."""
        with self._db.write() as conn:
            row = row_of(conn, conversation_id, client_id)
            check_free(conn, row, version, "add items once it has finished (its turn goes first)", None)
            append_items(conn, conversation_id, items, self._clock())
        return {
            "object": "list",
            "data": items,
            "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None,
            "has_more": False,
        }

    def get_conversation_item(self, conversation_id: str, item_id: str, client_id: str | None = None) -> dict[str, Any]:
        with self._db.read() as conn:
            row_of(conn, conversation_id, client_id)
            row = conn.execute(
                "SELECT data FROM conversation_items WHERE conversation_id = ? AND item_id = ? ORDER BY pos LIMIT 1",
                (conversation_id, item_id),
            ).fetchone()
        if row is None:
            raise NotFound(f"no item {item_id} in conversation {conversation_id}")
        item: dict[str, Any] = json.loads(row[0])
        return item

    def delete_conversation_item(
        self, conversation_id: str, item_id: str, client_id: str | None = None
    ) -> dict[str, Any]:
        """Delete an item; the conversation object (as OpenAI answers)."""
        with self._db.write() as conn:
            row = row_of(conn, conversation_id, client_id)
            n = conn.execute(
                "DELETE FROM conversation_items WHERE conversation_id = ? AND item_id = ?", (conversation_id, item_id)
            ).rowcount
            if not n:
                raise NotFound(f"no item {item_id} in conversation {conversation_id}")
            changed(conn, conversation_id)
            return conversation_object(row)
