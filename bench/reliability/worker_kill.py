"""Kill one gevent worker (never the master) while it runs tasks.

Each round sends background tasks under all three restart policies, waits
until a worker has claimed and started some, SIGKILLs that worker and copies
the database as its death left it. gunicorn must replace it, the master must
stay the same process, and the dead worker's tasks must follow their
restart policy through their expired leases (LMSP B.9, table 11.3) and then
finish, all without a service restart. The checker of :mod:`rel_checker` then verifies the logs.

    python bench/reliability/worker_kill.py --rounds 10 [--workers 1]
"""
from __future__ import annotations

import os
import random
import signal
import sqlite3
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rel_checker import (FINISHED, StoreView, Violation, check_log, check_recovery,  # noqa: E402
                         copy_db, integrity, open_copy, open_live)
from rel_harness import Server, bench_main  # noqa: E402

POLICIES = ("fail", "retry", "resume")


@dataclass
class WorkerKillReport:
    rounds: int = 0
    workers_killed: int = 0
    tasks: int = 0
    owned_by_killed: Counter = field(default_factory=Counter)   # "state+policy" at the kill
    outcomes: Counter = field(default_factory=Counter)          # "policy->final status"
    recovery_seconds: list[float] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    def summary(self) -> dict:
        rs = sorted(self.recovery_seconds)
        return {
            "rounds": self.rounds, "workers_killed": self.workers_killed, "tasks": self.tasks,
            "owned_by_killed_worker": dict(sorted(self.owned_by_killed.items())),
            "outcomes": dict(sorted(self.outcomes.items())),
            "seconds_to_all_finished_max": round(rs[-1], 2) if rs else None,
            "violations": len(self.violations),
            "first_violations": [str(v) for v in self.violations[:20]],
        }


def _backup(data_dir: Path, dest: Path) -> sqlite3.Connection:
    """What other connections see now: a copy made with SQLite's backup API."""
    src = open_live(data_dir)
    dest.unlink(missing_ok=True)
    dst = sqlite3.connect(str(dest), isolation_level=None)
    try:
        src.backup(dst)
    finally:
        src.close()
    return dst


def _as_found(visible: StoreView, raw: StoreView, after: StoreView) -> tuple[StoreView, list[Violation]]:
    """Per task, the state recovery started from: the raw copy when its log
    survived (the in-flight commit was kept), else the visible one."""
    chosen, out = {}, []
    for tid, seen in visible.tasks.items():
        a = after.tasks.get(tid)
        if a is None:
            out.append(Violation("lost", tid, "a task of the killed worker vanished"))
            continue
        for candidate in (raw.tasks.get(tid), seen):
            if candidate is not None and [e.key() for e in a.events[:len(candidate.events)]] == \
                    [e.key() for e in candidate.events]:
                chosen[tid] = candidate
                break
        else:
            out.append(Violation("rewritten", tid, f"events another connection could see changed: "
                                 f"{[e.key() for e in seen.events][-2:]} -> "
                                 f"{[e.key() for e in a.events[:len(seen.events)]][-2:]}"))
    return StoreView(chosen, {t.response_id: k for k, t in chosen.items()}), out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def owned_running(data_dir: Path, pid: int) -> list[sqlite3.Row]:
    conn = open_live(data_dir)
    try:
        return list(conn.execute("SELECT id, status, on_restart FROM tasks WHERE owner LIKE ? AND status IN "
                                 "('loading','running','cancelling')", (f"%:{pid}:%",)))
    finally:
        conn.close()


def busy_worker(server, data_dir: Path, deadline: float) -> int | None:
    """A worker that runs a task now (None if none does before ``deadline``)."""
    while time.monotonic() < deadline:
        for pid in server.worker_pids():
            if owned_running(data_dir, pid):
                return pid
        time.sleep(0.02)
    return None


def run_worker_kill(workdir: Path, rounds: int, *, seed: int = 0, workers: int = 1, tasks_per_round: int = 4,
                    max_tokens: int = 800, lease_seconds: float = 2.0, timeout: float = 120.0,
                    log=print) -> WorkerKillReport:
    rng = random.Random(seed)
    report = WorkerKillReport()
    data_dir = workdir / "data"
    server = Server(data_dir, log=workdir / "server.log",
                    env={"LMSP_LEASE_SECONDS": str(lease_seconds), "LMSP_WORKERS": str(workers)})
    server.start()
    try:
        client = server.pair(["responses:write", "responses:read"], name="worker-kill")
        master = server.master_pid()
        for rnd in range(rounds):
            ids = create_round(client, rnd, tasks_per_round, max_tokens, rng, report)
            # wait until a worker has started some of them
            victim = busy_worker(server, data_dir, time.monotonic() + timeout)
            if victim is None:
                report.violations.append(Violation("setup", None, f"round {rnd}: no worker ever ran a task"))
                break
            time.sleep(rng.uniform(0.05, 0.5))    # let it start more of them
            if not owned_running(data_dir, victim):  # its tasks ended meanwhile: one that still runs some
                victim = busy_worker(server, data_dir, time.monotonic() + 1.0) or victim
            before_workers = set(server.worker_pids())
            os.kill(victim, signal.SIGKILL)
            t_kill = time.monotonic()
            report.workers_killed += 1
            while _alive(victim):        # the signal is asynchronous: a commit may still land
                time.sleep(0.001)
            frozen, visible, raw = at_kill(workdir, victim, rnd, report)
            after = wait_round(server, data_dir, ids, rnd, t_kill, timeout, report)
            report.recovery_seconds.append(time.monotonic() - t_kill)
            if server.master_pid() != master:
                report.violations.append(Violation("master", None, "the master process changed"))
            now_workers = set(server.worker_pids())
            if victim in now_workers or len(now_workers) != len(before_workers):
                report.violations.append(Violation("replace", None, f"workers {before_workers} -> {now_workers}"))
            check_round(data_dir, ids, visible, raw, after, report)
            log(f"round {rnd + 1}/{rounds}: killed worker {victim} owning {len(frozen)} unfinished tasks; "
                f"{len(report.violations)} violations so far")
    finally:
        server.stop()
    return report


def create_round(client, rnd: int, tasks: int, max_tokens: int, rng: random.Random,
                 report: WorkerKillReport) -> list[str]:
    """The round's background tasks, the restart policies in turn; their response ids."""
    ids = []
    for i in range(tasks):
        body = {"model": "demo", "input": f"round {rnd} task {i}: tell a long story",
                "max_output_tokens": max_tokens, "temperature": 1.0, "seed": rng.randint(0, 2**31),
                "background": True, "on_restart": POLICIES[(rnd + i) % 3]}
        res = client.post("/v1/responses", body, headers={"Idempotency-Key": f"wk-{rnd}-{i}"})
        if res.status != 202:
            report.violations.append(Violation("http", None, f"create: {res.status} {res.body}"))
            continue
        ids.append(res.body["id"])
    return ids


def at_kill(workdir: Path, victim: int, rnd: int, report: WorkerKillReport) -> tuple[list[str], StoreView, StoreView]:
    """The killed worker's unfinished tasks, as other connections see them and in the raw files.

    Right after the kill the victim's tasks are frozen until their leases expire. Two
    copies: what other connections can see (read through the live -shm index) and the
    raw files. A worker killed inside COMMIT, after its commit frame reached the WAL but
    before it updated the index, leaves a transaction that nobody has seen: SQLite's
    recovery keeps it when no other process holds the database open (the raw copy), and
    a surviving worker's next write discards it (the visible copy). Either is a correct
    outcome; committed events that anyone could see must never change."""
    data_dir = workdir / "data"
    visible_conn = _backup(data_dir, workdir / "visible.db")
    raw_conn = open_copy(copy_db(data_dir, workdir / "at-kill"))
    frozen = sorted({r[0] for c in (raw_conn, visible_conn) for r in c.execute(
        "SELECT id FROM tasks WHERE owner LIKE ? AND status IN ('queued','loading','running','cancelling')",
        (f"%:{victim}:%",))})
    visible = StoreView.load(visible_conn, frozen)
    raw = StoreView.load(raw_conn, frozen)
    report.violations += integrity(raw_conn)
    visible_conn.close()
    raw_conn.close()
    if not frozen:
        report.violations.append(Violation("setup", None, f"round {rnd}: the killed worker held no "
                                           "unfinished task (they finished before the kill?)"))
    for t in visible.tasks.values():
        report.owned_by_killed[f"{t.status}+{t.on_restart}"] += 1
    return frozen, visible, raw


def wait_round(server: Server, data_dir: Path, ids: list[str], rnd: int, t_kill: float, timeout: float,
               report: WorkerKillReport) -> StoreView:
    """Wait for every task of the round to finish, the master alive; the store then."""
    while True:
        server.check_alive()
        conn = open_live(data_dir)
        after = StoreView.load(conn)
        conn.close()
        ours = [after.by_response(r) for r in ids]
        if all(t is not None and t.status in FINISHED for t in ours):
            return after
        if time.monotonic() - t_kill > timeout:
            report.violations.append(Violation(
                "stranded", None, f"round {rnd}: unfinished after {timeout}s: "
                + ", ".join(f"{t.id}={t.status}" for t in ours if t and t.status not in FINISHED)))
            return after
        time.sleep(0.1)


def check_round(data_dir: Path, ids: list[str], visible: StoreView, raw: StoreView, after: StoreView,
                report: WorkerKillReport) -> None:
    """The killed worker's tasks moved as the recovery table says; logs and files sound."""
    before, found = _as_found(visible, raw, after)
    report.violations += found + check_recovery(before, after)
    report.violations += check_log(after)
    conn = open_live(data_dir)
    report.violations += integrity(conn)
    conn.close()
    for rid in ids:
        t = after.by_response(rid)
        if t is not None:
            report.outcomes[f"{t.on_restart}->{t.status}"] += 1
    report.tasks += len(ids)
    report.rounds += 1


def main(argv: list[str] | None = None) -> int:
    def options(ap) -> None:
        ap.add_argument("--rounds", type=int, default=10)
        ap.add_argument("--workers", type=int, default=1)
        ap.add_argument("--seed", type=int, default=1)

    return bench_main(__doc__, argv, options,
                      lambda a, workdir, log: run_worker_kill(workdir, a.rounds, seed=a.seed, workers=a.workers,
                                                              log=log).summary(),
                      lambda summary: summary["violations"])


if __name__ == "__main__":
    sys.exit(main())
