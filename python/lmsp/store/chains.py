"""Chains of responses (LMSP B.11): responses linked by ``previous_response_id``.

The earlier turns of a chain are kept by reference, once each: when a response
is continued for the first time, its turn (the messages of its context held by
value, its input and its output, and the function calls they make) becomes a
row of ``chain_turns`` that names the turn before it. A new response's request
keeps no copy of them: its context is the rows from its previous response's
turn up to the first (:func:`expand`), read again when its task is claimed, so
a resumed or retried task renders the same prompt. The rows are never changed
and outlive the responses they came from (DELETE, ``store: false`` delivery).

Every response of a chain carries its id (``tasks.chain_id``: the id of the
first response continued), and ``chains.newest_at`` holds the time of its
newest creation or end. Retention (:mod:`.retention`) takes a chain as one:
its responses and turns go together once ``newest_at`` is past retention and
none of them is unfinished. A response in no chain has ``chain_id`` NULL and
goes on its own time, as before.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ..errors import NotFound

#: the key of the request under which the web layer hands the previous
#: response's turn to the store (never stored)
TURN_KEY = "chain_turn"


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


_EXPAND = """
WITH RECURSIVE up(id, parent, messages, calls, depth) AS (
    SELECT response_id, parent_id, messages, calls, 0 FROM chain_turns WHERE response_id = ?
    UNION ALL
    SELECT t.response_id, t.parent_id, t.messages, t.calls, up.depth + 1
    FROM chain_turns t JOIN up ON t.response_id = up.parent
)
SELECT messages, calls FROM up ORDER BY depth DESC"""


def expand(conn: sqlite3.Connection, response_id: str) -> tuple[list[dict[str, Any]], dict[str, str]] | None:
    """The messages a response's continuation sees (its chain's turns up to its own)
    and the calls made in them; None when the response's turn is not kept."""
    rows = conn.execute(_EXPAND, (response_id,)).fetchall()
    if not rows:
        return None
    messages: list[dict[str, Any]] = []
    calls: dict[str, str] = {}
    for text, made in rows:
        messages += json.loads(text)
        calls.update(json.loads(made))
    return messages, calls


def stored_request(request: Any) -> tuple[Any, dict[str, Any] | None]:
    """The request as the store keeps it, and the previous response's turn it names:
    a request that continues a response keeps its context by reference."""
    turn = request.get(TURN_KEY) if isinstance(request, dict) else None
    if turn is None:
        return request, None
    kept = {k: v for k, v in request.items() if k not in (TURN_KEY, "context")}
    return kept, turn


def with_context(conn: sqlite3.Connection, request: dict[str, Any]) -> dict[str, Any]:
    """A stored request with its context read back from its chain (the prompt's messages)."""
    previous = request.get("previous_response_id")
    if previous is None or "context" in request:
        return request
    found = expand(conn, previous)
    if found is None:  # its chain went with retention: it can no longer be run
        raise NotFound(f"the earlier turns of response {previous} are gone", param="previous_response_id")
    return {**request, "context": found[0]}


def link(conn: sqlite3.Connection, task_id: str, turn: dict[str, Any], now: float) -> None:
    """A new task's response continues ``turn["response_id"]``: that turn is kept (once)
    and the new response joins its chain, whose newest time is now."""
    rid, parent = turn["response_id"], turn.get("parent")
    row = conn.execute("SELECT chain_id FROM chain_turns WHERE response_id = ?", (rid,)).fetchone()
    if row is not None:
        chain = row[0]
    else:
        if "messages" not in turn:  # read as kept, and taken by retention since
            raise NotFound(f"no response {rid}", param="previous_response_id")
        if parent is not None:
            up = conn.execute("SELECT chain_id FROM chain_turns WHERE response_id = ?", (parent,)).fetchone()
            if up is None:  # retention took the chain since the context was read
                raise NotFound(f"no response {rid}", param="previous_response_id")
            chain = up[0]
        else:
            own = conn.execute("SELECT chain_id FROM tasks WHERE response_id = ?", (rid,)).fetchone()
            chain = own[0] if own is not None and own[0] is not None else rid
        conn.execute(
            "INSERT INTO chain_turns (response_id, chain_id, parent_id, messages, calls) VALUES (?,?,?,?,?)",
            (rid, chain, parent, dumps(turn["messages"]), dumps(turn.get("calls") or {})),
        )
        conn.execute("UPDATE tasks SET chain_id = ? WHERE response_id = ? AND chain_id IS NULL", (chain, rid))
    conn.execute(
        "INSERT INTO chains (id, newest_at) VALUES (?, ?) "
        "ON CONFLICT (id) DO UPDATE SET newest_at = max(newest_at, excluded.newest_at)",
        (chain, now),
    )
    conn.execute("UPDATE tasks SET chain_id = ? WHERE id = ?", (chain, task_id))


def finished(conn: sqlite3.Connection, task_id: str, now: float) -> None:
    """A task ended: its chain's newest time is now (nothing for a task in no chain)."""
    conn.execute(
        "UPDATE chains SET newest_at = max(newest_at, ?) WHERE id = (SELECT chain_id FROM tasks WHERE id = ?)",
        (now, task_id),
    )


def expired(conn: sqlite3.Connection, chain: str, cutoff: float) -> bool:
    """Whether a chain's newest time is before ``cutoff``."""
    row = conn.execute("SELECT newest_at FROM chains WHERE id = ?", (chain,)).fetchone()
    return row is not None and row[0] < cutoff


def drop_if_empty(conn: sqlite3.Connection, chain: str | None) -> None:
    """A chain none of whose responses is left (all deleted) goes with its turns."""
    if (
        chain is not None
        and conn.execute("SELECT 1 FROM tasks WHERE chain_id = ? LIMIT 1", (chain,)).fetchone() is None
    ):
        conn.execute("DELETE FROM chain_turns WHERE chain_id = ?", (chain,))
        conn.execute("DELETE FROM chains WHERE id = ?", (chain,))
