"""Retention (LMSP B.10): finished tasks with their events and responses,
expired idempotency keys and spent pairing codes are deleted in small
transactions, so that the write lock is never held long."""

from __future__ import annotations

from . import states as st
from .base import FINISHED_SQL, StoreBase, last_seq_sql
from .idempotency import answer_keys


class RetentionArea(StoreBase):
    """``gc``: what is past its time goes."""

    def gc(self, *, retention: float, batch: int = 500) -> dict:
        """Delete finished tasks (with their events and responses) that finished more than
        ``retention`` seconds ago, expired idempotency keys and spent pairing codes.

        Every transaction deletes at most about ``batch`` rows, so the write lock
        is never held long; unfinished tasks are never touched.
        """
        if batch < 1:
            raise ValueError("batch must be at least 1")
        counts = {"tasks": 0, "events": 0, "idempotency_keys": 0, "pairings": 0}
        now = self._clock()
        cutoff = now - float(retention)
        self._gc_tasks(cutoff, batch, counts)
        counts["idempotency_keys"] = self._gc_keys(now, batch)
        counts["pairings"] = self._gc_pairings(cutoff, batch)
        return counts

    def _gc_tasks(self, cutoff: float, batch: int, counts: dict) -> None:
        """The finished tasks, with their events and responses, that finished before ``cutoff``."""
        while True:
            before = counts["tasks"]
            with self._db.read() as conn:
                rows = conn.execute(
                    f"SELECT id, response_id, {last_seq_sql('tasks')} FROM tasks WHERE "
                    f"finished_at < ? AND status IN {FINISHED_SQL} ORDER BY finished_at LIMIT ?",
                    (cutoff, batch),
                ).fetchall()
            if not rows:
                break
            budget, doomed = 0, []
            for tid, rid, last_seq in rows:
                low = 1
                while last_seq - low + 1 > batch - budget:  # a long log: delete it in slices
                    high = low + (batch - budget) - 1
                    with self._db.write() as conn:
                        counts["events"] += conn.execute(
                            "DELETE FROM task_events WHERE task_id = ? AND seq BETWEEN ? AND ?", (tid, low, high)
                        ).rowcount
                    low, budget = high + 1, 0
                doomed.append((tid, rid, low))
                budget += max(0, last_seq - low + 1) + 1
                if budget >= batch:
                    self._gc_delete(doomed, cutoff, counts)
                    doomed, budget = [], 0
            if doomed:
                self._gc_delete(doomed, cutoff, counts)
            if counts["tasks"] == before:  # nothing could go (cannot happen; never spin)
                break

    def _gc_keys(self, now: float, batch: int) -> int:
        """The idempotency keys expired by ``now``; returns how many went."""
        total = 0
        while True:
            with self._db.write() as conn:
                n = conn.execute(
                    "DELETE FROM idempotency_keys WHERE (client_id, key) IN (SELECT client_id, key "
                    "FROM idempotency_keys WHERE expires_at <= ? LIMIT ?)",
                    (now, batch),
                ).rowcount
            total += n
            if n < batch:
                return total

    def _gc_pairings(self, cutoff: float, batch: int) -> int:
        """The pairing codes expired, and the failed pairing attempts made, before ``cutoff``;
        returns how many codes went."""
        total = 0
        while True:
            with self._db.write() as conn:
                n = conn.execute(
                    "DELETE FROM pairings WHERE id IN (SELECT id FROM pairings WHERE expires_at < ? LIMIT ?)",
                    (cutoff, batch),
                ).rowcount
                conn.execute(
                    "DELETE FROM pairing_failures WHERE id IN (SELECT id FROM pairing_failures WHERE at < ? LIMIT ?)",
                    (cutoff, batch),
                )
            total += n
            if n < batch:
                return total

    def _gc_delete(self, doomed: list[tuple[str, str, int]], cutoff: float, counts: dict) -> None:
        with self._db.write() as conn:
            for tid, rid, _ in doomed:
                row = conn.execute("SELECT status, finished_at FROM tasks WHERE id = ?", (tid,)).fetchone()
                if row is None or row["status"] not in st.FINISHED or not row["finished_at"] < cutoff:
                    continue
                counts["events"] += conn.execute("DELETE FROM task_events WHERE task_id = ?", (tid,)).rowcount
                answer_keys(conn, tid, None)
                conn.execute("DELETE FROM responses WHERE id = ?", (rid,))  # cascades to the task
                counts["tasks"] += 1
