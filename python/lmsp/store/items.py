"""Stored items: a response's input items (``response_items``) and the pages
that list them and a conversation's items (OpenAI's cursor pages: ``after``,
``before``, ``limit``, ``order``)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ..errors import InvalidRequest
from .base import StoreBase, dumps
from .chains import expand

#: the tables of item lists: (table, the column naming the list)
RESPONSE_LIST = ("response_items", "response_id")
CONVERSATION_LIST = ("conversation_items", "conversation_id")


def insert_response_items(conn: sqlite3.Connection, response_id: str, items: list[dict[str, Any]]) -> None:
    conn.executemany(
        "INSERT INTO response_items (response_id, pos, item_id, data) VALUES (?,?,?,?)",
        [(response_id, pos, item["id"], dumps(item)) for pos, item in enumerate(items)],
    )


def _cursor_pos(conn: sqlite3.Connection, where: tuple[str, str], key: str, item_id: str, param: str) -> int:
    table, column = where
    row = conn.execute(f"SELECT min(pos) FROM {table} WHERE {column} = ? AND item_id = ?", (key, item_id)).fetchone()
    if row[0] is None:
        raise InvalidRequest(f"{param!r} names no item of this list: {item_id[:100]!r}", param=param)
    return int(row[0])


def item_page(
    conn: sqlite3.Connection,
    where: tuple[str, str],
    key: str,
    *,
    after: str | None = None,
    before: str | None = None,
    limit: int = 20,
    order: str = "desc",
) -> dict[str, Any]:
    """A page of a list of items: those strictly between the cursors ``after`` and
    ``before`` (item ids of the list) in ``order``, the first ``limit`` of them."""
    table, column = where
    clauses: list[str] = [f"{column} = ?"]
    args: list[Any] = [key]
    newer, older = (">", "<") if order == "asc" else ("<", ">")
    if after is not None:
        clauses.append(f"pos {newer} ?")
        args.append(_cursor_pos(conn, where, key, after, "after"))
    if before is not None:
        clauses.append(f"pos {older} ?")
        args.append(_cursor_pos(conn, where, key, before, "before"))
    rows = conn.execute(
        f"SELECT data FROM {table} WHERE {' AND '.join(clauses)} ORDER BY pos {'ASC' if order == 'asc' else 'DESC'}"
        " LIMIT ?",
        [*args, limit + 1],
    ).fetchall()
    data = [json.loads(r[0]) for r in rows[:limit]]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(rows) > limit,
    }


class ItemsArea(StoreBase):
    """A response's input items, and the turns a continuation of it sees."""

    def chain_context(self, response_id: str) -> tuple[list[dict[str, Any]], dict[str, str]] | None:
        """The messages and calls a continuation of ``response_id`` sees, when its turn
        is kept in its chain already (:func:`.chains.expand`); None otherwise."""
        with self._db.read() as conn:
            return expand(conn, response_id)

    def list_input_items(
        self,
        response_id: str,
        client_id: str | None = None,
        *,
        after: str | None = None,
        before: str | None = None,
        limit: int = 20,
        order: str = "desc",
    ) -> dict[str, Any]:
        """A page of the input items of a response (another client's: NotFound)."""
        with self._db.read() as conn:
            self._response_row(conn, response_id, client_id)
            return item_page(conn, RESPONSE_LIST, response_id, after=after, before=before, limit=limit, order=order)

    def input_item_list(self, response_id: str, client_id: str | None = None) -> list[dict[str, Any]]:
        """Every input item of a response, in order."""
        with self._db.read() as conn:
            self._response_row(conn, response_id, client_id)
            rows = conn.execute(
                "SELECT data FROM response_items WHERE response_id = ? ORDER BY pos", (response_id,)
            ).fetchall()
        return [json.loads(r[0]) for r in rows]
