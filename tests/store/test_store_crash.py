"""Crash safety: a writer killed with SIGKILL at random moments, many times, on one database."""
from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sqlite3
import time

import pytest

import store_children
from lmsp.store import UNFINISHED, Store
from store_checks import SPEC_RECOVERY

KILLS = 50


def drain(conn, acked_tasks: dict[str, int]) -> None:
    while conn.poll():
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] in ("task", "seq"):
            acked_tasks[msg[1]] = max(acked_tasks.get(msg[1], 0), msg[2])


def wait_for_a_task(conn, acked_tasks: dict[str, int], timeout: float = 60.0) -> bool:
    """Drain until the writer acknowledges a task not seen before (False: none within ``timeout``)."""
    before = len(acked_tasks)
    deadline = time.monotonic() + timeout
    while len(acked_tasks) == before:
        left = deadline - time.monotonic()
        if left <= 0 or not conn.poll(left):
            return False
        drain(conn, acked_tasks)
    return True


def check_database(path) -> None:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        # every task's log is 1..n: no gap, no repeat (the primary key rules out a repeat)
        bad = conn.execute(
            "SELECT t.id, count(e.seq), min(e.seq), max(e.seq) FROM tasks t "
            "LEFT JOIN task_events e ON e.task_id = t.id GROUP BY t.id "
            "HAVING count(e.seq) = 0 OR min(e.seq) != 1 OR max(e.seq) != count(e.seq)").fetchall()
        assert bad == []
    finally:
        conn.close()


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_no_acknowledged_write(db_path):
    spawn = multiprocessing.get_context("spawn")
    rng = random.Random(1234)
    acked: dict[str, int] = {}
    Store.open(db_path).close()
    recovered_cells: set[tuple[str, str]] = set()
    for round_ in range(KILLS):
        parent_end, child_end = spawn.Pipe(duplex=False)
        child = spawn.Process(target=store_children.crash_writer, args=(str(db_path), round_, child_end))
        child.start()
        child_end.close()
        assert parent_end.poll(60), "the writer never started"
        drain(parent_end, acked)
        # the writer really writes in every round, however slow the disk's fsyncs
        assert wait_for_a_task(parent_end, acked), f"round {round_}: the writer acknowledged no task"
        time.sleep(rng.uniform(0.0, 0.12))  # a random moment, mid-transaction or not
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL
        drain(parent_end, acked)
        parent_end.close()

        check_database(db_path)
        store = Store.open(db_path)
        try:
            for tid, seq in acked.items():  # every acknowledged write is there
                assert store.last_sequence(tid) >= seq
            leftovers = {}
            page = store.list_tasks(limit=100)
            while True:
                for t in page["data"]:
                    if t["status"] in UNFINISHED:
                        leftovers[t["id"]] = (t["status"], t["on_restart"])
                if not page["has_more"]:
                    break
                page = store.list_tasks(limit=100, after=page["last_id"])
            # the table's rows: a task the kills catch running round after round would otherwise
            # reach max_attempts (test_store_poison.py checks that limit)
            store.recover(startup=True, max_attempts=KILLS + 1)
            for tid, cell in leftovers.items():
                assert store.get_task(tid)["status"] == SPEC_RECOVERY[cell]
                recovered_cells.add(cell)
        finally:
            store.close()
        check_database(db_path)
    assert len(acked) >= KILLS  # (a new task acknowledged in every round, checked above)
    assert recovered_cells, "no kill left an unfinished task for recovery to treat"
    print(f"{len(acked)} acknowledged tasks, recovery cells seen: {sorted(recovered_cells)}")
