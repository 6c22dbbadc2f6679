"""Sharing the box between clients: the order tasks start in, each client's
limits, and its tokens per hour.

**Fair starts.** A task gets a start tag when it is created (start-time fair
queuing): ``max(v, the client's previous tag + 1 / priority)``, or ``v`` for a
client with no unfinished task, where ``v`` is the tag of the queue's head (or,
with nothing queued, the newest tag of a started task). Claims take tasks
by tag, then by creation (a task to resume keeps its tag): a client's first task waits behind at most one
task of each other client, and a client of priority 2 starts two tasks for
another's one. Tags live in the task rows, so the order survives restarts and
holds for every worker of the database.

**Limits** (``None``: none), kept in the client's row and checked in the
transaction that creates a task, so that concurrent requests cannot all pass:

- ``max_queued``: tasks waiting to start; one more is 429 ``rate_limited``;
- ``max_running``: tasks started at once; the others wait their turn;
- ``tokens_per_hour``: input and output tokens of the tasks finished in this
  clock hour; past it, 429 ``quota_exceeded`` until the next hour.

**Usage**: each finished task adds its tokens to its client's row of the hour
(``client_usage``), kept as long as the retention keeps responses.
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any

from ..errors import QuotaExceeded, RateLimited
from .states import CANCELLING, RUNNING, STARTED_SQL, UNFINISHED_SQL

#: the tasks a worker may claim: queued, or running and left by their worker (to
#: resume); they start in ``START_ORDER``, by the index tasks_start_order
CLAIMABLE_SQL = "owner IS NULL AND status IN ('queued','running')"
START_ORDER = "start_tag, created_at, id"
#: the claimable tasks by their start order (SQLite would otherwise read them all by status)
QUEUE = f"tasks INDEXED BY tasks_start_order WHERE {CLAIMABLE_SQL}"
#: a client's unfinished tasks by their tags
CLIENT_TASKS = f"tasks INDEXED BY tasks_client_tags WHERE status IN {UNFINISHED_SQL} AND client_id IS ?"
LIMITS = ("priority", "max_running", "max_queued", "tokens_per_hour")


def start_tag(conn: sqlite3.Connection, client_id: str | None) -> float:
    """The start tag of a task the client creates now."""
    head = conn.execute(f"SELECT min(start_tag) FROM {QUEUE}").fetchone()[0]
    if head is None:
        head = conn.execute(f"SELECT max(start_tag) FROM tasks WHERE status IN {STARTED_SQL}").fetchone()[0]
    now = float(head or 0.0)
    previous = conn.execute(f"SELECT max(start_tag) FROM {CLIENT_TASKS}", (client_id,)).fetchone()[0]
    if previous is None:
        return now
    return max(now, float(previous) + 1.0 / priority(conn, client_id))


def priority(conn: sqlite3.Connection, client_id: str | None) -> int:
    if client_id is None:
        return 1
    row = conn.execute("SELECT priority FROM clients WHERE id = ?", (client_id,)).fetchone()
    return 1 if row is None else max(1, int(row[0]))


def hour_of(now: float) -> int:
    return int(now // 3600)


def check_limits(conn: sqlite3.Connection, client_id: str | None, now: float) -> None:
    """RateLimited (``max_queued``) or QuotaExceeded (``tokens_per_hour``) for a task the
    client would create now."""
    if client_id is None:
        return
    row = conn.execute("SELECT max_queued, tokens_per_hour FROM clients WHERE id = ?", (client_id,)).fetchone()
    if row is None:
        return
    max_queued, per_hour = row
    if max_queued is not None:
        queued = conn.execute(f"SELECT count(*) FROM {CLIENT_TASKS} AND status = 'queued'", (client_id,)).fetchone()[0]
        if queued >= max_queued:
            raise RateLimited(
                f"this client has {queued} tasks waiting to start, the most it may have (max_queued); "
                "wait for some to start",
                retry_after=1,
            )
    if per_hour is not None:
        used = conn.execute(
            "SELECT tokens FROM client_usage WHERE client_id = ? AND hour = ?", (client_id, hour_of(now))
        ).fetchone()
        if used is not None and used[0] >= per_hour:
            retry = max(1, math.ceil((hour_of(now) + 1) * 3600 - now))
            raise QuotaExceeded(
                f"this client has used {used[0]} tokens this hour, its quota (tokens_per_hour {per_hour})",
                retry_after=retry,
            )


def may_start(conn: sqlite3.Connection, client_id: str | None, starting: int = 0) -> bool:
    """Whether one more of the client's tasks may start (``max_running``), with
    ``starting`` of them being started in the same claim."""
    if client_id is None:
        return True
    row = conn.execute("SELECT max_running FROM clients WHERE id = ?", (client_id,)).fetchone()
    if row is None or row[0] is None:
        return True
    running = conn.execute(
        f"SELECT count(*) FROM tasks WHERE client_id = ? AND status IN {STARTED_SQL}", (client_id,)
    ).fetchone()[0]
    return bool(running + starting < row[0])


def record_usage(conn: sqlite3.Connection, client_id: str | None, now: float, tokens: int) -> None:
    """A finished task's tokens, added to its client's hour."""
    if client_id is None:
        return
    conn.execute(
        "INSERT INTO client_usage (client_id, hour, tasks, tokens) VALUES (?, ?, 1, ?)"
        " ON CONFLICT (client_id, hour) DO UPDATE SET tasks = tasks + 1, tokens = tokens + excluded.tokens",
        (client_id, hour_of(now), max(0, int(tokens))),
    )


def queue_places(conn: sqlite3.Connection, task: dict[str, Any]) -> dict[str, int]:
    """A queued task's ``queue_position`` (1: next to start) and ``queued_ahead`` (the
    queued tasks of its model that start before it); {} for any other task."""
    if task["status"] != "queued" or task.get("owner") is not None:
        return {}
    tag, created, tid = conn.execute(
        "SELECT start_tag, created_at, id FROM tasks WHERE id = ?", (task["id"],)
    ).fetchone()
    before = f"SELECT count(*) FROM {QUEUE} AND ({START_ORDER}) < (?, ?, ?)"
    ahead = conn.execute(before, (tag, created, tid)).fetchone()[0]
    same = conn.execute(before + " AND model = ?", (tag, created, tid, task["model"])).fetchone()[0]
    return {"queue_position": ahead + 1, "queued_ahead": same}


# the token ids of a task's events after a mark, each row's comma separated: its commas plus one
_TOKENS_AFTER = (
    "SELECT coalesce(sum(length(tokens) - length(replace(tokens, ',', '')) + 1), 0) FROM task_events"
    " WHERE task_id = ? AND seq > ? AND tokens IS NOT NULL AND tokens <> ''"
)


def output_so_far(conn: sqlite3.Connection, task: dict[str, Any]) -> dict[str, int]:
    """A running (or cancelling) task's ``output_tokens``: the tokens its current attempt
    generated and committed, those held back without text included; {} for any other
    task. One read of its events by the table's key, nothing written."""
    if task["status"] not in (RUNNING, CANCELLING):
        return {}
    committed = conn.execute(_TOKENS_AFTER, (task["id"], task["attempt_seq"])).fetchone()[0]
    pending = task.get("pending_tokens") or ""
    return {"output_tokens": int(committed) + (pending.count(",") + 1 if pending else 0)}
