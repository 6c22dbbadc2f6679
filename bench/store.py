"""Store benchmark: durable task creation latency and event append rates.

    python bench/store.py [--dir DIR] [--seconds 3] [--rounds 11] [--durability full]

Measures, on one database file in DIR (a temporary folder by default):
  * create_task latency to a durable commit (p50/p99);
  * output events appended one per transaction vs batched per engine step
    (append_step with every task's delta in one transaction), at 1, 8 and 64
    concurrent tasks;
  * the same rows inserted on a bare sqlite3 connection with the same pragmas
    and schema, as the reference, and once more in a file of SQLite's default
    page size and checkpoint threshold; and prints the ratios;
  * for scale, the same rows appended to a table in insertion order (no
    per-task key): what the store's layout, one B-tree leaf per running task
    per step, costs against a plain log;
  * tasks coming and going: with 64 running tasks, the time of a step in which
    one task ends and the next step's new task (created claimed) joins, against
    a step of the same tasks alone, taking turns.

Every figure also goes to ``bench/results/<time>-store_<durability>-none.json``
(``--out``).
"""
from __future__ import annotations

import argparse
import shlex
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lmsp.store import Store
from lmsp.store.db import Database

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_path import write_result  # noqa: E402

# (concurrent tasks, engine steps per transaction): a commit thread that finds several
# steps waiting (while the previous fsync ran) writes them in one transaction
CASES = ((1, 1), (8, 1), (64, 1), (64, 4), (64, 16))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def running_tasks(store: Store, n: int, owner: str) -> list[str]:
    tids = [store.create_task(client_id="cli", model="m", request={"input": "x"}, on_restart="resume",
                              background=True, stream=False)["task"]["id"] for _ in range(n)]
    claimed = store.claim(owner, limit=n, lease=3600)
    assert sorted(c["task_id"] for c in claimed) == sorted(tids)
    for tid in tids:
        store.set_running(tid, owner)
    store.append_step(owner, [{"task_id": t, "delta": "a", "tokens": [1]} for t in tids])  # opens the items
    return tids


def timed(fn, seconds: float) -> tuple[int, float]:
    """Run ``fn`` (which returns how many events it wrote) until ``seconds`` pass."""
    events, start = 0, time.perf_counter()
    while True:
        events += fn()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return events, elapsed


def bench_create(store: Store, n: int) -> dict:
    latencies = []
    for i in range(n):
        t0 = time.perf_counter()
        store.create_task(client_id="cli", model="m", request={"input": f"request {i}", "max_output_tokens": 64},
                          on_restart="fail", background=True, stream=False)
        latencies.append(time.perf_counter() - t0)
    return {"p50_ms": percentile(latencies, 0.5) * 1e3, "p99_ms": percentile(latencies, 0.99) * 1e3,
            "mean_ms": statistics.fmean(latencies) * 1e3, "n": n}


def store_steppers(store: Store, k: int, steps: int) -> tuple:
    """(one event per transaction, ``steps`` engine steps per transaction) writers for ``k`` tasks."""
    owner = f"bench-{k}"
    tids = running_tasks(store, k, owner)
    items = [{"task_id": t, "delta": " tok", "tokens": [42]} for t in tids] * steps

    def one_per_txn() -> int:
        for item in items:
            store.append_step(owner, [item])
        return len(items)

    def batched() -> int:
        store.append_step(owner, items)
        return len(items)

    return one_per_txn, batched


def bare_stepper(path: Path, durability: str, k: int, steps: int, sqlite_defaults: bool = False) -> tuple:
    """The same event rows on a bare connection: BEGIN IMMEDIATE, executemany, COMMIT per step.
    ``sqlite_defaults``: in a file of 4 KB pages, checkpointed every 1000 pages."""
    if sqlite_defaults:
        first = sqlite3.connect(path, isolation_level=None)
        first.execute("PRAGMA page_size = 4096")
        first.execute("PRAGMA journal_mode = WAL")  # writes the file: the page size is set
        first.close()
    store = Store.open(path, durability=durability)
    tids = running_tasks(store, k, "bare")
    store.close()
    conn = Database(path, durability=durability).connect()  # the same pragmas, the same schema
    if sqlite_defaults:
        conn.execute("PRAGMA wal_autocheckpoint = 1000")
    seq = {t: conn.execute("SELECT max(seq) FROM task_events WHERE task_id = ?", (t,)).fetchone()[0] for t in tids}
    return inserting_step(conn, "task_events", seq, steps), conn


def inserting_step(conn: sqlite3.Connection, table: str, seq: dict[str, int], steps: int):
    """A writer that inserts ``steps`` delta rows for each task of ``seq`` (its last
    numbers) into ``table``: BEGIN IMMEDIATE, executemany, COMMIT."""
    insert = (f"INSERT INTO {table} (task_id, seq, type, created_at, text, tokens, data) "
              "VALUES (?,?,?,?,?,?,?)")
    now = time.time()

    def step() -> int:
        rows = []
        for _ in range(steps):
            for t in seq:
                seq[t] += 1
                rows.append((t, seq[t], "response.output_text.delta", now, " tok", "42", None))
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(insert, rows)
        conn.execute("COMMIT")
        return len(rows)

    return step


def log_stepper(path: Path, durability: str, k: int, steps: int) -> tuple:
    """The same rows appended in insertion order to a rowid table with no other key: a
    transaction dirties the log's last leaves only, however many tasks it carries (the
    store's ``task_events`` is keyed by task, so each running task's delta lands in a
    leaf of its own). Not a layout the store can use as it is: a task's events and its
    last number would need a scan of the log."""
    conn = Database(path, durability=durability).connect()
    conn.execute("CREATE TABLE IF NOT EXISTS event_log (id INTEGER PRIMARY KEY, task_id TEXT NOT NULL, "
                 "seq INTEGER NOT NULL, type TEXT NOT NULL, created_at REAL NOT NULL, text TEXT, tokens TEXT, "
                 "data TEXT)")
    seq = dict.fromkeys((f"task_{i:026d}" for i in range(k)), 0)
    return inserting_step(conn, "event_log", seq, steps), conn


def bench_turnover(store: Store, k: int, steps: int) -> dict:
    """``k`` running tasks; steps alternate between the tasks alone and a step in which
    the oldest task ends while a task created claimed (never stepped) takes its first
    step. Medians of each kind's commit time, in ms."""
    owner = f"turnover-{k}"
    tids = running_tasks(store, k, owner)
    plain, turnover = [], []

    def delta(tid: str) -> dict:
        return {"task_id": tid, "delta": " tok", "tokens": [42]}

    for _ in range(steps):
        t0 = time.perf_counter()
        store.append_step(owner, [delta(t) for t in tids])
        plain.append(time.perf_counter() - t0)
        new = store.create_task(client_id="cli", model="m", request={"input": "x"}, on_restart="resume",
                                background=True, stream=False, claim=(owner, 3600))["task"]["id"]
        items = [{"task_id": tids[0], "delta": "", "tokens": [], "finish": "stop"}]
        items += [delta(t) for t in tids[1:]] + [delta(new)]
        t0 = time.perf_counter()
        store.append_step(owner, items)
        turnover.append(time.perf_counter() - t0)
        tids = tids[1:] + [new]
    return {"plain_ms": statistics.median(plain) * 1e3, "turnover_ms": statistics.median(turnover) * 1e3}


def rates(writers: dict, seconds: float, rounds: int) -> tuple[dict, dict]:
    """Events/s of each writer over ``rounds`` interleaved slices (the writers take turns, so
    that load from other processes hits them alike): ``(medians, samples per round)``."""
    samples: dict[str, list[float]] = {name: [] for name in writers}
    for _ in range(rounds):
        for name, fn in writers.items():
            events, elapsed = timed(fn, seconds / rounds)
            samples[name].append(events / elapsed)
    return {name: statistics.median(values) for name, values in samples.items()}, samples


def paired(samples: dict, name: str, reference: str) -> float:
    """The median over the rounds of ``name``'s rate over ``reference``'s in the same round:
    the disk's speed drifts from second to second, less so within one round."""
    return statistics.median(a / b for a, b in zip(samples[name], samples[reference]))


def bench_cases(root: Path, args: argparse.Namespace) -> list[dict]:
    """Every case of CASES: each writer and its references, in interleaved slices; prints a row each."""
    print(f"{'tasks':>5} {'steps/txn':>9} {'store 1/txn':>12} {'store batched':>14} {'bare batched':>13} "
          f"{'batched/bare':>13} {'bare 4K pages':>14} {'batched/bare4K':>15} {'bare log':>10} "
          f"{'log/bare':>9}   (events/s)")
    rows = []
    for k, steps in CASES:
        # each writer in a file of its own, as each bare reference is: one writer's
        # commits and checkpoints do not land in another's figure
        single_store = Store.open(root / f"single-{k}-{steps}.db", durability=args.durability)
        single, _ = store_steppers(single_store, k, steps)
        store = Store.open(root / f"append-{k}-{steps}.db", durability=args.durability)
        _, batched = store_steppers(store, k, steps)
        bare, bare_conn = bare_stepper(root / f"bare-{k}-{steps}.db", args.durability, k, steps)
        bare4k, bare4k_conn = bare_stepper(root / f"bare4k-{k}-{steps}.db", args.durability, k, steps, True)
        log, log_conn = log_stepper(root / f"log-{k}-{steps}.db", args.durability, k, steps)
        r, samples = rates({"single": single, "batched": batched, "bare": bare, "bare4k": bare4k,
                            "log": log}, args.seconds, args.rounds)
        row = {"tasks": k, "steps_per_txn": steps, "store_1_per_txn": r["single"], "store_batched": r["batched"],
               "bare_batched": r["bare"], "batched_over_bare": paired(samples, "batched", "bare"),
               "bare_4k_pages": r["bare4k"], "batched_over_bare_4k": paired(samples, "batched", "bare4k"),
               "bare_log": r["log"], "log_over_bare": paired(samples, "log", "bare")}
        rows.append(row)
        print(f"{k:>5} {steps:>9} {r['single']:>12,.0f} {r['batched']:>14,.0f} {r['bare']:>13,.0f} "
              f"{row['batched_over_bare']:>13.2f} {r['bare4k']:>14,.0f} "
              f"{row['batched_over_bare_4k']:>15.2f} {r['log']:>10,.0f} {row['log_over_bare']:>9.2f}")
        sys.stdout.flush()
        for closing in (store, single_store, bare_conn, bare4k_conn, log_conn):
            closing.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="where the database files go (default: a temp dir)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per writer and concurrency level")
    parser.add_argument("--rounds", type=int, default=11, help="interleaved slices per measurement")
    parser.add_argument("--creates", type=int, default=300, help="create_task calls for the latency figures")
    parser.add_argument("--durability", default="full", choices=("full", "normal", "off"))
    parser.add_argument("--turnover-steps", type=int, default=1000, help="steps of each kind for the turnover figure")
    parser.add_argument("--out", type=Path, default=None,
                        help="the result file (default: bench/results/TIME-store_DURABILITY-none.json)")
    args = parser.parse_args(argv)
    started = time.time()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        print(f"sqlite {sqlite3.sqlite_version}, durability={args.durability}, dir={root}")
        store = Store.open(root / "create.db", durability=args.durability)
        c = bench_create(store, args.creates)
        store.close()
        print(f"create_task to a committed 202: p50 {c['p50_ms']:.2f} ms  p99 {c['p99_ms']:.2f} ms  "
              f"(mean {c['mean_ms']:.2f} ms, n={c['n']})")
        rows = bench_cases(root, args)
        store = Store.open(root / "turnover.db", durability=args.durability)
        t = bench_turnover(store, 64, args.turnover_steps)
        store.close()
        print(f"64 tasks, one ending and one new in a step: {t['turnover_ms']:.3f} ms a step; "
              f"the same tasks alone: {t['plain_ms']:.3f} ms (medians of {args.turnover_steps} each)")
    write_result(f"store_{args.durability}", None, {
        "command": shlex.join([sys.executable, *sys.argv]), "sqlite": sqlite3.sqlite_version,
        "settings": {k: v for k, v in vars(args).items() if k not in ("dir", "out")},
        "create_task_ms": c, "rows": rows, "turnover": t}, started=started, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
