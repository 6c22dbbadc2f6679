"""Crash soak: SIGKILL the whole service at random moments under a mixed load.

Each cycle starts ``lmsp serve`` (gunicorn) on the same data directory, sends
plain, streamed and background requests under all three restart policies
with random cancels and random client disconnects, and kills every process
of the service with SIGKILL at a random moment (now and then already during
start-up and recovery). The files the kill left are copied and read; after
the restart the checker of :mod:`rel_checker` verifies LMSP chapter 11:

- every response acknowledged to a client (202, or ``response.created`` on a
  stream) is in the files the crash left, and still there after the restart;
- each unfinished task moved as 11.3 says, with its event, and committed
  events were never changed (a ``resume`` task continues without re-emitting);
- every event log is gapless, one terminal event ends each finished task, and
  its output text equals the concatenation of its deltas;
- the events a stream showed are the committed ones;
- idempotent retries of the requests in flight at the kill made no second task;
- ``PRAGMA integrity_check`` is ``ok`` on the crashed files and the live ones;
- no request got a 500.

    python bench/reliability/soak.py --cycles 100 [--seed N] [--workdir DIR] [--json [OUT]]
"""
from __future__ import annotations

import contextlib
import http.client
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rel_checker import (StoreView, Violation, check_acknowledged, check_idempotency,  # noqa: E402
                         check_log, check_recovery, check_seen_events, copy_db, integrity, open_copy,
                         open_live)
from rel_harness import Client, Server, bench_main  # noqa: E402

POLICIES = ("fail", "retry", "resume")
KINDS = ("plain", "stream", "background", "background_stream")
PROMPTS = ["Tell me a story about a lighthouse.", "List the planets.", "Why is the sky blue?",
           "Write a poem about rain.", "Count to twenty.", "Describe a cat in detail.",
           # over 64 tokens: prefilled by the engine's tiled steps
           "Summarize this passage in two sentences. The harbour town woke before dawn: fishermen "
           "checked their nets by lantern light, the baker lit the ovens, and gulls circled the "
           "breakwater waiting for scraps. By noon the market filled with traders from the hill "
           "villages, selling wool, cheese and honey, while children ran between the stalls. In the "
           "evening the lighthouse keeper climbed the spiral stairs, trimmed the wick and watched "
           "the boats come home one by one across the darkening water."]
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}


@dataclass
class Req:
    key: str
    kind: str
    body: dict
    status: int | None = None
    response_id: str | None = None
    acknowledged: bool = False
    seen: list[dict] = field(default_factory=list)
    in_flight: bool = False      # sent, no complete answer before the kill
    answer: dict | None = None


@dataclass
class SoakReport:
    cycles: int = 0
    kills: int = 0
    kills_during_startup: int = 0
    requests: Counter = field(default_factory=Counter)
    statuses: Counter = field(default_factory=Counter)
    acknowledged: int = 0
    cancels: Counter = field(default_factory=Counter)
    disconnects: int = 0
    in_flight_at_kill: int = 0
    retries: Counter = field(default_factory=Counter)
    recovered: Counter = field(default_factory=Counter)   # "state+policy" found at start
    tasks: int = 0
    events: int = 0
    finished_checked: int = 0
    replayed: int = 0            # resumed/requeued tasks compared with an uninterrupted run
    violations: list[Violation] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict:
        return {
            "cycles": self.cycles, "kills": self.kills, "kills_during_startup": self.kills_during_startup,
            "requests": dict(self.requests), "http_statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "acknowledged": self.acknowledged, "cancels": dict(self.cancels),
            "stream_disconnects": self.disconnects, "in_flight_at_kill": self.in_flight_at_kill,
            "idempotent_retries": dict(self.retries),
            "unfinished_at_restart": dict(sorted(self.recovered.items())),
            "tasks": self.tasks, "events": self.events, "finished_tasks_checked": self.finished_checked,
            "interrupted_tasks_replayed": self.replayed,
            "violations": len(self.violations),
            "violation_kinds": dict(Counter(v.kind for v in self.violations)),
            "first_violations": [str(v) for v in self.violations[:20]],
            "seconds": round(self.seconds, 1),
        }


class Load:
    """Client threads sending the mixed load until told to stop."""

    def __init__(self, client: Client, rng: random.Random, cycle: int, report: SoakReport,
                 known: list[str], model: str, max_tokens: tuple[int, int]) -> None:
        self.client, self.rng, self.cycle, self.report = client, rng, cycle, report
        self.known, self.model, self.max_tokens = known, model, max_tokens
        self.reqs: list[Req] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.n = 0

    def new_req(self, rng: random.Random, kind: str | None = None) -> Req:
        with self.lock:
            self.n += 1
            key = f"soak-{self.cycle}-{self.n}-{rng.getrandbits(40):010x}"
        kind = kind or rng.choices(KINDS, weights=(2, 2, 4, 1))[0]
        body: dict = {
            "model": self.model,
            "input": rng.choice(PROMPTS) if rng.random() < 0.7
            else [{"role": "user", "content": rng.choice(PROMPTS)}],
            "max_output_tokens": rng.randint(*self.max_tokens),
            "temperature": rng.choice([0, 0.7, 1.0]),
            "seed": rng.randint(0, 2**31),
            "on_restart": rng.choice(POLICIES),
            "metadata": {"soak": key},
        }
        if kind in ("stream", "background_stream"):
            body["stream"] = True
        if kind in ("background", "background_stream"):
            body["background"] = True
        req = Req(key, kind, body)
        with self.lock:
            self.reqs.append(req)
            self.report.requests[kind] += 1
        return req

    def note_status(self, status: int, what: str, body) -> None:
        with self.lock:
            self.report.statuses[status] += 1
            if status >= 500 and status != 503:
                self.report.violations.append(Violation("http_5xx", None, f"{what}: {status} {str(body)[:200]}"))

    def run_one(self, rng: random.Random) -> None:
        if self.known and rng.random() < 0.15:
            self.cancel(rng.choice(self.known))
            return
        req = self.new_req(rng)
        headers = {"Idempotency-Key": req.key}
        try:
            if req.kind in ("plain", "background"):
                res = self.client.post("/v1/responses", req.body, headers=headers, timeout=120)
                req.status, req.answer = res.status, res.body if isinstance(res.body, dict) else None
                self.note_status(res.status, req.kind, res.body)
                if req.answer and res.status in (200, 202):
                    req.response_id = req.answer.get("id")
                    req.acknowledged = res.status == 202
                    with self.lock:
                        self.known.append(req.response_id)
                    if req.kind == "background" and rng.random() < 0.25:
                        time.sleep(rng.uniform(0, 0.5))
                        self.cancel(req.response_id)
            else:
                cut = rng.randint(1, 12) if rng.random() < 0.35 else None
                with self.client.stream("POST", "/v1/responses", req.body, headers=headers,
                                        timeout=120) as (status, _, events):
                    req.status = status
                    self.note_status(status, req.kind, "")
                    if status != 200:
                        return
                    for ev in events:
                        data = ev.data if isinstance(ev.data, dict) else {}
                        req.seen.append(data)
                        if data.get("type") == "response.created":
                            req.response_id = (data.get("response") or {}).get("id")
                            req.acknowledged = True
                            with self.lock:
                                self.known.append(req.response_id)
                        if data.get("type") in TERMINAL:
                            break
                        if cut is not None and len(req.seen) >= cut:
                            with self.lock:
                                self.report.disconnects += 1
                            break
                    else:
                        if not req.seen or req.seen[-1].get("type") not in TERMINAL:
                            if cut is None:
                                req.in_flight = True
        except ConnectionRefusedError:
            with self.lock:
                self.reqs.remove(req)
                self.report.requests[req.kind] -= 1
        except (OSError, http.client.HTTPException):
            req.in_flight = True

    def anchor(self, rng: random.Random, max_tokens: int = 1024) -> None:
        """Send one long background request and return once it is acknowledged.

        A kill right after its 202 finds it queued or running, so every cycle
        leaves recovery at least one unfinished task to move, however fast the
        rest of the load finished.
        """
        req = self.new_req(rng, "background")
        req.body["max_output_tokens"] = max_tokens
        res = self.client.post("/v1/responses", req.body, headers={"Idempotency-Key": req.key}, timeout=120)
        req.status, req.answer = res.status, res.body if isinstance(res.body, dict) else None
        self.note_status(res.status, "anchor", res.body)
        if req.answer and res.status == 202:
            req.response_id, req.acknowledged = req.answer.get("id"), True

    def cancel(self, rid: str) -> None:
        try:
            res = self.client.post(f"/v1/responses/{rid}/cancel", {}, timeout=60)
        except (OSError, http.client.HTTPException):
            return
        self.note_status(res.status, "cancel", res.body)
        with self.lock:
            self.report.cancels[str(res.status)] += 1

    def worker(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            self.run_one(rng)

    def start(self, n: int) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.worker, args=(self.rng.getrandbits(32),), daemon=True)
                   for _ in range(n)]
        for t in threads:
            t.start()
        return threads


def retry_in_flight(client: Client, reqs: list[Req], report: SoakReport) -> None:
    """Send every request that got no answer again, with the same key and body."""
    def one(req: Req) -> None:
        headers = {"Idempotency-Key": req.key}
        try:
            if "stream" in req.body:
                with client.stream("POST", "/v1/responses", req.body, headers=headers,
                                   timeout=120) as (status, hdrs, events):
                    label = f"{req.kind} {status}{' replayed' if hdrs.get('idempotent-replayed') else ''}"
                    if status == 200:
                        next(events, None)  # the first event says which response it is
                    elif status >= 500:
                        report.violations.append(Violation("http_5xx", None, f"retry {req.key}: {status}"))
            else:
                res = client.post("/v1/responses", req.body, headers=headers, timeout=120)
                label = f"{req.kind} {res.status}{' replayed' if res.headers.get('idempotent-replayed') else ''}"
                if res.status >= 500:
                    report.violations.append(Violation("http_5xx", None, f"retry {req.key}: {res.status} "
                                                       f"{str(res.body)[:200]}"))
                elif res.status == 202 and req.acknowledged and res.body.get("id") != req.response_id:
                    report.violations.append(Violation("duplicate", req.response_id,
                                                       f"retry of {req.key} answered another id"))
        except (OSError, http.client.HTTPException) as exc:
            label = f"{req.kind} error {type(exc).__name__}"
        report.retries[label] += 1

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in reqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)


REPLAY_FIELDS = ("model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "top_k",
                 "seed", "stop")


def _output_text(response: dict) -> str:
    return "".join(part.get("text", "") for item in response.get("output") or []
                   for part in item.get("content") or [] if part.get("type") == "output_text")


def check_replay(client: Client, view: StoreView, limit: int, rng: random.Random) -> tuple[int, list[Violation]]:
    """Resumed and requeued tasks continue the same output: sampling depends only
    on (seed, position), so an uninterrupted run of the same request (a plain
    request now) must give exactly the text the crash-interrupted task has."""
    candidates = sorted((t for t in view.tasks.values() if t.status == "completed"
                         and any(e.type in ("task.resumed", "task.requeued") for e in t.events)),
                        key=lambda t: t.id)
    out: list[Violation] = []
    sample = rng.sample(candidates, min(limit, len(candidates)))
    for t in sample:
        body = {k: t.request[k] for k in REPLAY_FIELDS if t.request.get(k) not in (None, [])}
        res = client.post("/v1/responses", body, timeout=300)
        if res.status != 200 or not isinstance(res.body, dict):
            out.append(Violation("replay_http", t.id, f"{res.status} {str(res.body)[:200]}"))
            continue
        text = _output_text(res.body)
        if text != (t.output_text or ""):
            kind = "resumed" if any(e.type == "task.resumed" for e in t.events) else "requeued"
            out.append(Violation("replay_diverged", t.id, f"{kind} task: {t.output_text!r:.80} vs an "
                                 f"uninterrupted run {text!r:.80}"))
    return len(sample), out


def run_soak(workdir: Path, cycles: int, *, seed: int = 0, clients: int = 4,
             load_seconds: tuple[float, float] = (0.3, 2.5), backlog: int = 24, max_tokens: tuple[int, int] = (4, 64),
             startup_kill_rate: float = 0.1, replay_limit: int = 30, env: dict[str, str] | None = None,
             model_file: Path | None = None, log=print) -> SoakReport:
    rng = random.Random(seed)
    report = SoakReport()
    t0 = time.monotonic()
    data_dir = workdir / "data"
    server = Server(data_dir, log=workdir / "server.log", env=env, model=model_file)
    model = model_file.stem if model_file is not None else "demo"  # the id lmsp serve --model gives it
    known: list[str] = []
    before: StoreView | None = None
    pending: list[Req] = []        # requests of the last cycle, checked after the restart
    client: Client | None = None
    try:
        for cycle in range(cycles + 1):
            # -- start; sometimes kill it again during start-up and recovery
            if before is not None and rng.random() < startup_kill_rate:
                before = kill_during_startup(server, rng, report, workdir)
            server.start()
            if client is None:
                client = server.pair(["responses:write", "responses:read", "models:read"], name="soak")
            after = check_restart(data_dir, client, before, pending, report)
            if cycle == cycles:
                n, found = check_replay(client, after, replay_limit, rng)
                report.replayed = n
                report.violations += found
                break
            trim_backlog(client, after, backlog, report)
            # -- load, then SIGKILL at a random moment
            load = Load(client, rng, cycle, report, known, model, max_tokens)
            pending, before = load_and_kill(server, load, clients, load_seconds, workdir)
            if len(known) > 500:
                del known[:-500]
            log(f"cycle {cycle + 1}/{cycles} ({time.monotonic() - t0:.0f}s): {len(pending)} requests, "
                f"{sum(1 for t in before.tasks.values() if t.status in ('queued', 'loading', 'running', 'cancelling'))}"
                f" unfinished at the kill, {len(report.violations)} violations so far")
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        report.seconds = time.monotonic() - t0
    return report


def crashed_files(workdir: Path, report: SoakReport) -> StoreView:
    """What the crash left (lmsp.db and its WAL, copied), checked for integrity."""
    conn = open_copy(copy_db(workdir / "data", workdir / "at-kill"))
    report.violations += integrity(conn)
    view = StoreView.load(conn)
    conn.close()
    return view


def kill_during_startup(server: Server, rng: random.Random, report: SoakReport, workdir: Path) -> StoreView:
    """Start the service and SIGKILL it 0-0.8 s later, during start-up and recovery."""
    server.start(wait=False)
    time.sleep(rng.uniform(0.0, 0.8))
    server.crash()
    report.kills += 1
    report.kills_during_startup += 1
    return crashed_files(workdir, report)


def check_restart(data_dir: Path, client: Client, before: StoreView | None, pending: list[Req],
                  report: SoakReport) -> StoreView:
    """After a restart: what recovery made of the files the crash left, the requests of the
    last cycle (acknowledged ones kept, streams' events committed, those in flight sent again)."""
    conn = open_live(data_dir)
    after = StoreView.load(conn)
    report.violations += integrity(conn)
    conn.close()
    report.violations += check_log(after)
    if before is not None:
        for t in before.tasks.values():
            if t.status in ("queued", "loading", "running", "cancelling"):
                report.recovered[f"{t.status}+{t.on_restart}"] += 1
        report.violations += check_recovery(before, after)
        acked = [r.response_id for r in pending if r.acknowledged and r.response_id]
        report.violations += check_acknowledged(acked, before, "in the files the kill left")
        report.violations += check_acknowledged(acked, after, "after the restart")
        for r in pending:
            if r.seen and r.response_id:
                report.violations += check_seen_events(r.response_id, r.seen, before)
        in_flight = [r for r in pending if r.in_flight]
        report.in_flight_at_kill += len(in_flight)
        retry_in_flight(client, in_flight, report)
        conn = open_live(data_dir)
        view = StoreView.load(conn)
        conn.close()
        report.violations += check_idempotency([r.key for r in pending], view)
    report.tasks = len(after.tasks)
    report.events = after.n_events()
    report.finished_checked = sum(1 for t in after.tasks.values() if t.status in ("completed", "failed", "cancelled"))
    return after


def trim_backlog(client: Client, after: StoreView, backlog: int, report: SoakReport) -> None:
    """Keep the backlog bounded: cancel the oldest unfinished tasks (random cancels of queued
    and running tasks are part of the load anyway)."""
    unfinished = sorted((t.id, t.response_id) for t in after.tasks.values()
                        if t.status in ("queued", "loading", "running"))
    for _, rid in unfinished[:max(0, len(unfinished) - backlog)]:
        res = client.post(f"/v1/responses/{rid}/cancel", {})
        report.cancels[f"backlog {res.status}"] += 1
        if res.status >= 500:
            report.violations.append(Violation("http_5xx", rid, f"cancel: {res.status} {res.body}"))


def load_and_kill(server: Server, load: Load, clients: int, load_seconds: tuple[float, float],
                  workdir: Path) -> tuple[list[Req], StoreView]:
    """The cycle's load for a random time, then SIGKILL; (its requests, the files it left)."""
    rng, report = load.rng, load.report
    threads = load.start(clients)
    time.sleep(rng.uniform(*load_seconds))
    if rng.random() < 0.4:
        # cancel a few of the newest responses and kill right after the
        # answers: running tasks are then often still `cancelling`
        for rid in list(load.known[-3:]):
            load.cancel(rid)
    load.anchor(rng)
    server.crash()
    load.stop.set()
    for t in threads:
        t.join(60)
    report.kills += 1
    report.cycles += 1
    report.acknowledged += sum(1 for r in load.reqs if r.acknowledged)
    return load.reqs, crashed_files(workdir, report)


def main(argv: list[str] | None = None) -> int:
    def options(ap) -> None:
        ap.add_argument("--cycles", type=int, default=100)
        ap.add_argument("--seed", type=int, default=1)
        ap.add_argument("--clients", type=int, default=4)
        ap.add_argument("--model", type=Path, default=None,
                        help="a GGUF file to serve instead of the demo model")

    return bench_main(__doc__, argv, options,
                      lambda a, workdir, log: run_soak(workdir, a.cycles, seed=a.seed, clients=a.clients,
                                                       model_file=a.model, log=log).summary(),
                      lambda summary: summary["violations"])


if __name__ == "__main__":
    sys.exit(main())
