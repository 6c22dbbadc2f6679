"""A conversation's rows as the task life cycle touches them: a new response takes
its conversation (:func:`take`), and its final transition appends its turn
(:func:`append_turn`). Apart from :mod:`.conversations` so that the task
primitives of :mod:`.base` can call it.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Callable

from lmsp.items import listed as shapes
from ..errors import ConversationBusy, NotFound
from . import states as st

UNFINISHED_SQL = "(" + ",".join(f"'{s}'" for s in st.UNFINISHED) + ")"


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def conversation_object(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "object": "conversation",
        "created_at": int(row["created_at"]),
        "metadata": json.loads(row["metadata"]),
    }


def row_of(conn: sqlite3.Connection, conversation_id: str, client_id: str | None) -> sqlite3.Row:
    row = conn.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
    if row is None or (client_id is not None and row["client_id"] != client_id):  # another's: unknown alike
        raise NotFound(f"no conversation {conversation_id}", param="conversation")
    return row


def append_items(conn: sqlite3.Connection, conversation_id: str, items: list[dict[str, Any]], now: float) -> None:
    top = conn.execute(
        "SELECT coalesce(max(pos), -1) FROM conversation_items WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()[0]
    conn.executemany(
        "INSERT INTO conversation_items (conversation_id, pos, item_id, data, created_at) VALUES (?,?,?,?,?)",
        [(conversation_id, top + 1 + i, item["id"], dumps(item), now) for i, item in enumerate(items)],
    )
    changed(conn, conversation_id)


def changed(conn: sqlite3.Connection, conversation_id: str) -> None:
    conn.execute("UPDATE conversations SET version = version + 1 WHERE id = ?", (conversation_id,))


def take(conn: sqlite3.Connection, conversation: tuple[str, int], client_id: str | None, task_id: str) -> None:
    """A new response's task takes the conversation ``(id, the version its context was
    read at)``: ConversationBusy while another response of it is in progress, or when its
    items changed since its context was read."""
    conversation_id, version = conversation
    row = row_of(conn, conversation_id, client_id)
    check_free(conn, row, version, "wait for it to finish", "conversation")
    conn.execute("UPDATE conversations SET busy_task = ? WHERE id = ?", (task_id, conversation_id))


def check_free(conn: sqlite3.Connection, row: sqlite3.Row, version: int | None, then: str, param: str | None) -> None:
    """ConversationBusy (naming ``param``) while a response of the conversation ``row`` is
    in progress (``then``: what the client should do about it), or when its items changed
    since ``version`` (None: not asked), which the request was read at."""
    if row["busy_task"] is not None:
        busy = conn.execute(
            f"SELECT 1 FROM tasks WHERE id = ? AND status IN {UNFINISHED_SQL}", (row["busy_task"],)
        ).fetchone()
        if busy is not None:
            raise ConversationBusy(f"conversation {row['id']} has a response in progress; {then}", param=param)
    if version is not None and row["version"] != version:
        raise ConversationBusy(
            f"conversation {row['id']} changed while this request was read; send it again", param=param
        )


def append_turn(conn: sqlite3.Connection, task: dict, now: float, render: Callable[[], dict[str, Any]]) -> None:
    """The final transition of ``task``: when it holds a conversation, the response's
    input items and its output (``render()``: the Response object) go to the end of the
    conversation, which is freed."""
    row = conn.execute("SELECT id FROM conversations WHERE busy_task = ?", (task["id"],)).fetchone()
    if row is None:
        return
    inputs = [
        json.loads(r[0])
        for r in conn.execute(
            "SELECT data FROM response_items WHERE response_id = ? ORDER BY pos", (task["response_id"],)
        )
    ]
    append_items(conn, row[0], inputs + shapes.output_items(render()), now)
    conn.execute("UPDATE conversations SET busy_task = NULL WHERE id = ?", (row[0],))
