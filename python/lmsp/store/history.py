"""The service's own history, for the operator's plots: one row a minute per worker.

Each worker's janitor thread (:mod:`lmsp.runtime.history`) writes, once a
minute, what it counted in the minute that ended: tokens generated, tasks
finished and failed, its time-to-first-token histogram, the sequences it was
decoding; the same transaction adds what the box holds (tasks queued in the
store, the registered models' bytes), and the worker gives the database's and
the KV files' bytes. A read sums the workers of each minute: their counts and
running sequences add up, the box-wide figures (queued, bytes) are the largest
any worker saw, and the histograms are merged.

A time-to-first-token histogram is kept as JSON, ``[[upper bound in ms, count],
..., [null, count over the last bound]]``: the bounds travel with the counts, so
rows of workers with other bounds still merge. Retention (:mod:`.retention`)
drops rows past a day, or past the configured retention when that is shorter.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from .base import StoreBase
from .db import Database, delete_in_batches

MINUTE = 60
HISTORY_SECONDS = 86400.0  # rows are kept this long at most
COUNTS = ("tokens", "tasks_finished", "errors")

#: a histogram: its buckets by upper bound in ms (None: over the last bound)
Buckets = dict[float | None, int]


class HistoryArea(StoreBase):
    """``record_minute``, ``service_history``: the service's history by minute."""

    def record_minute(self, worker: str, minute: int, figures: dict[str, Any]) -> None:
        """Write ``worker``'s row of ``minute`` (Unix seconds // 60): ``figures`` holds
        ``tokens``, ``tasks_finished``, ``errors`` (counted in the minute), ``ttft``
        (a histogram as :func:`merge_buckets` takes it, or None), ``running``,
        ``db_bytes`` and ``kv_bytes`` (None: unknown). One transaction, which also
        reads the tasks queued and the models' bytes; a second write of the same
        minute adds its counts to the first."""
        with self._db.write() as conn:
            queued = conn.execute("SELECT count(*) FROM tasks WHERE status = 'queued'").fetchone()[0]
            models = conn.execute("SELECT coalesce(sum(size_bytes), 0) FROM models").fetchone()[0]
            row = dict(figures, queued=queued, model_bytes=models)
            row["ttft"] = _merged_ttft(conn, worker, minute, figures.get("ttft"))
            conn.execute(
                "INSERT INTO service_history (minute, worker, tokens, tasks_finished, errors, ttft, queued, running,"
                " db_bytes, kv_bytes, model_bytes) VALUES (:minute, :worker, :tokens, :tasks_finished, :errors,"
                " :ttft, :queued, :running, :db_bytes, :kv_bytes, :model_bytes)"
                " ON CONFLICT (minute, worker) DO UPDATE SET tokens = tokens + excluded.tokens,"
                " tasks_finished = tasks_finished + excluded.tasks_finished, errors = errors + excluded.errors,"
                " ttft = excluded.ttft, queued = excluded.queued, running = excluded.running,"
                " db_bytes = excluded.db_bytes, kv_bytes = excluded.kv_bytes, model_bytes = excluded.model_bytes",
                {
                    "minute": int(minute),
                    "worker": worker,
                    **{name: max(0, int(row.get(name) or 0)) for name in (*COUNTS, "queued", "running")},
                    "ttft": row["ttft"],
                    **{name: _bytes(row.get(name)) for name in ("db_bytes", "kv_bytes", "model_bytes")},
                },
            )

    def service_history(self, minutes: int) -> list[dict[str, Any]]:
        """The last ``minutes`` minutes before the store's clock's current one (and that
        one, when a row of it is there), oldest first, the workers of each minute
        summed: ``minute``, the counts, ``running``, ``queued``, the bytes, and ``ttft``
        (the merged histogram, :data:`Buckets`). A minute no worker wrote is absent."""
        since = int(self._clock() // MINUTE) - int(minutes)
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT minute, sum(tokens), sum(tasks_finished), sum(errors), sum(running), max(queued),"
                " max(db_bytes), max(kv_bytes), max(model_bytes), json_group_array(ttft)"
                " FROM service_history WHERE minute >= ? GROUP BY minute ORDER BY minute",
                (since,),
            ).fetchall()
        out = []
        for row in rows:
            histograms = [json.loads(text) for text in json.loads(row[9]) if text is not None]
            out.append(
                {
                    "minute": row[0],
                    "tokens": row[1],
                    "tasks_finished": row[2],
                    "errors": row[3],
                    "running": row[4],
                    "queued": row[5],
                    "db_bytes": row[6],
                    "kv_bytes": row[7],
                    "model_bytes": row[8],
                    "ttft": merge_buckets(histograms),
                }
            )
        return out


def gc(db: Database, cutoff: float, batch: int) -> int:
    """Delete the rows of the minutes that ended before ``cutoff`` (by the table's key,
    minute first), about ``batch`` a transaction; returns how many went."""
    return delete_in_batches(
        db,
        "DELETE FROM service_history WHERE (minute, worker) IN (SELECT minute, worker"
        " FROM service_history WHERE minute < ? LIMIT ?)",
        (int(cutoff // MINUTE),),
        batch,
    )


def merge_buckets(histograms: list[list[list[Any]]]) -> Buckets:
    """Histograms of pairs ``[upper bound ms or None, count]`` merged into one."""
    merged: Buckets = {}
    for pairs in histograms:
        for bound, n in pairs:
            key = None if bound is None else float(bound)
            merged[key] = merged.get(key, 0) + int(n)
    return merged


def percentile(buckets: Buckets, q: float) -> float | None:
    """The ``q`` quantile (0 < q <= 1) of a histogram, interpolated within its bucket
    (from the bound below, 0 for the first); a rank over the last bound answers that
    bound. None for an empty histogram."""
    total = sum(buckets.values())
    if total <= 0:
        return None
    bounds = sorted(b for b in buckets if b is not None)
    rank, seen, lower = q * total, 0, 0.0
    for bound in bounds:
        n = buckets[bound]
        if n and seen + n >= rank:
            return lower + (bound - lower) * (rank - seen) / n
        seen, lower = seen + n, bound
    return lower if bounds else None  # over the last bound: that bound, a floor


def _merged_ttft(conn: sqlite3.Connection, worker: str, minute: int, ttft: list[list[Any]] | None) -> str | None:
    """The row's histogram as JSON, with the one already written for the minute (a
    second write) merged in."""
    old = conn.execute(
        "SELECT ttft FROM service_history WHERE minute = ? AND worker = ?", (int(minute), worker)
    ).fetchone()
    parts = [ttft] if ttft else []
    if old is not None and old[0] is not None:
        parts.append(json.loads(old[0]))
    if not parts:
        return None
    merged = merge_buckets(parts)
    return json.dumps([[bound, n] for bound, n in merged.items()], separators=(",", ":"))


def _bytes(value: Any) -> int | None:
    return None if value is None else max(0, int(value))
