"""Retention (LMSP B.10): finished tasks with their events and responses,
expired idempotency keys, spent pairing codes, the clients' usage of past
hours and the service's history past a day (:mod:`.history`) are deleted in
small transactions, so that the write lock is never held long.

A chain of responses (:mod:`.chains`) goes as one, on its newest response's
time: a task in no chain is found by the partial index ``tasks_finished``
(which leaves chained tasks out), a chain by ``chains_newest`` and its tasks
by ``tasks_chain``, so that a round reads only what is past its time."""

from __future__ import annotations

import sqlite3

from . import chains
from . import states as st
from . import history
from .base import FINISHED_SQL, StoreBase, last_seq_sql
from .db import delete_in_batches
from .idempotency import answer_keys
from .sharing import hour_of

# the expiry queries, each answered from its index (tests/store/test_store_chains.py)
EXPIRED_TASKS_SQL = (
    f"SELECT id, response_id, {last_seq_sql('tasks')} FROM tasks INDEXED BY tasks_finished WHERE finished_at < ? "
    f"AND chain_id IS NULL AND status IN {FINISHED_SQL} ORDER BY finished_at LIMIT ?"
)
EXPIRED_CHAINS_SQL = (
    "SELECT newest_at, id FROM chains WHERE newest_at < ? AND (newest_at, id) > (?, ?) ORDER BY newest_at, id LIMIT ?"
)
CHAIN_TASKS_SQL = f"SELECT id, response_id, {last_seq_sql('tasks')}, status FROM tasks WHERE chain_id = ?"


class RetentionArea(StoreBase):
    """``gc``: what is past its time goes."""

    def gc(self, *, retention: float, batch: int = 500) -> dict:
        """Delete finished tasks (with their events and responses) that finished more than
        ``retention`` seconds ago, expired idempotency keys, spent pairing codes,
        the clients' usage of the hours that ended more than ``retention`` ago, and
        the service's history of the minutes that ended more than a day (or
        ``retention``, when shorter) ago.

        Every transaction deletes at most about ``batch`` rows, so the write lock
        is never held long; unfinished tasks are never touched.
        """
        if batch < 1:
            raise ValueError("batch must be at least 1")
        counts = dict.fromkeys(
            ("tasks", "events", "idempotency_keys", "pairings", "client_usage", "service_history"), 0
        )
        now = self._clock()
        cutoff = now - float(retention)
        self._gc_tasks(cutoff, batch, counts)
        counts["idempotency_keys"] = self._gc_keys(now, batch)
        counts["pairings"] = self._gc_pairings(cutoff, batch)
        counts["client_usage"] = self._gc_usage(cutoff, batch)
        counts["service_history"] = history.gc(self._db, now - min(float(retention), history.HISTORY_SECONDS), batch)
        return counts

    def _gc_tasks(self, cutoff: float, batch: int, counts: dict) -> None:
        """The finished tasks in no chain, with their events and responses, that finished
        before ``cutoff``; then the chains whose newest time is before it."""
        while True:
            before = counts["tasks"]
            with self._db.read() as conn:
                rows = conn.execute(EXPIRED_TASKS_SQL, (cutoff, batch)).fetchall()
            if not rows:
                break
            self._gc_rows(rows, cutoff, batch, counts, None)
            if counts["tasks"] == before:  # nothing could go (cannot happen; never spin)
                break
        self._gc_chains(cutoff, batch, counts)

    def _gc_chains(self, cutoff: float, batch: int, counts: dict) -> None:
        """Each chain whose newest time is before ``cutoff``, whole: its responses, then
        its turns. A chain with an unfinished response is in use: its time is now."""
        now, after = self._clock(), (float("-inf"), "")
        while True:
            with self._db.read() as conn:  # each chain once a round: one kept is passed by
                found = conn.execute(EXPIRED_CHAINS_SQL, (cutoff, *after, batch)).fetchall()
            if not found:
                return
            after = tuple(found[-1])
            for _, chain in found:
                with self._db.read() as conn:
                    rows = conn.execute(CHAIN_TASKS_SQL, (chain,)).fetchall()
                if any(row[3] not in st.FINISHED for row in rows):
                    with self._db.write() as conn:
                        conn.execute("UPDATE chains SET newest_at = max(newest_at, ?) WHERE id = ?", (now, chain))
                    continue
                self._gc_rows([row[:3] for row in rows], cutoff, batch, counts, chain)
                with self._db.write() as conn:  # its turns last: a chain taken up again keeps them
                    if chains.expired(conn, chain, cutoff):
                        chains.drop_if_empty(conn, chain)

    def _gc_rows(self, rows: list, cutoff: float, batch: int, counts: dict, chain: str | None) -> None:
        """Delete the tasks of ``rows`` (id, response id, last event number) with their
        events, a long log in slices, about ``batch`` rows a transaction."""
        budget, doomed = 0, []
        for tid, rid, last_seq in rows:
            low = 1
            while last_seq - low + 1 > batch - budget:  # a long log: delete it in slices
                high = low + (batch - budget) - 1
                with self._db.write() as conn:
                    if not _doomed(conn, tid, cutoff, chain):  # continued since it was read: kept whole
                        break
                    counts["events"] += conn.execute(
                        "DELETE FROM task_events WHERE task_id = ? AND seq BETWEEN ? AND ?", (tid, low, high)
                    ).rowcount
                low, budget = high + 1, 0
            doomed.append((tid, rid, low))
            budget += max(0, last_seq - low + 1) + 1
            if budget >= batch:
                self._gc_delete(doomed, cutoff, counts, chain)
                doomed, budget = [], 0
        if doomed:
            self._gc_delete(doomed, cutoff, counts, chain)

    def _gc_keys(self, now: float, batch: int) -> int:
        """The idempotency keys expired by ``now``; returns how many went."""
        return delete_in_batches(
            self._db,
            "DELETE FROM idempotency_keys WHERE (client_id, key) IN (SELECT client_id, key "
            "FROM idempotency_keys WHERE expires_at <= ? LIMIT ?)",
            (now,),
            batch,
        )

    def _gc_pairings(self, cutoff: float, batch: int) -> int:
        """The pairing codes expired, and the failed pairing attempts made, before ``cutoff``;
        returns how many codes went."""
        delete_in_batches(
            self._db,
            "DELETE FROM pairing_failures WHERE id IN (SELECT id FROM pairing_failures WHERE at < ? LIMIT ?)",
            (cutoff,),
            batch,
        )
        return delete_in_batches(
            self._db,
            "DELETE FROM pairings WHERE id IN (SELECT id FROM pairings WHERE expires_at < ? LIMIT ?)",
            (cutoff,),
            batch,
        )

    def _gc_usage(self, cutoff: float, batch: int) -> int:
        """The clients' usage rows of the hours that ended before ``cutoff`` (by
        ``client_usage_hour``; the hours before cutoff's own ended before it); returns
        how many went."""
        return delete_in_batches(
            self._db,
            "DELETE FROM client_usage WHERE (client_id, hour) IN (SELECT client_id, hour "
            "FROM client_usage WHERE hour < ? LIMIT ?)",
            (hour_of(cutoff),),
            batch,
        )

    def _gc_delete(self, doomed: list[tuple[str, str, int]], cutoff: float, counts: dict, chain: str | None) -> None:
        """Delete tasks still past ``cutoff`` in this transaction: finished, and in no
        chain, or in ``chain`` while it is expired."""
        with self._db.write() as conn:
            for tid, rid, _ in doomed:
                if not _doomed(conn, tid, cutoff, chain):
                    continue
                counts["events"] += conn.execute("DELETE FROM task_events WHERE task_id = ?", (tid,)).rowcount
                answer_keys(conn, tid, None)
                conn.execute("DELETE FROM responses WHERE id = ?", (rid,))  # cascades to the task
                counts["tasks"] += 1


def _doomed(conn: sqlite3.Connection, task_id: str, cutoff: float, chain: str | None) -> bool:
    """Whether a task is still past ``cutoff`` in this transaction: finished before it,
    and in no chain (``chain`` None), or in ``chain`` while that one is expired (a
    response that joined a chain, or a chain continued since, is kept)."""
    row = conn.execute("SELECT status, finished_at, chain_id FROM tasks WHERE id = ?", (task_id,)).fetchone()
    if row is None or row["status"] not in st.FINISHED or not row["finished_at"] < cutoff:
        return False
    if row["chain_id"] != chain:
        return False
    return chain is None or chains.expired(conn, chain, cutoff)
