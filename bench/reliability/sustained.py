"""Sustained load: is the worker's memory flat and its latency steady?

Runs ``lmsp serve`` and keeps ``--clients`` threads busy for ``--duration``
seconds with a mix of plain and streamed generations, background requests
followed by a poll, cancels and reads. Every second the resident memory
(VmRSS) of each worker is sampled; every request's latency is kept. The
figures, per minute: requests, errors, p50/p95/p99 latency of plain
requests and of reads, worker RSS. Memory counts as flat when the RSS after
the warm-up minute grows by less than ``--rss-bound-mib``; latency as not
drifting when the last minute's p50 of plain requests is within
``--drift-bound`` times the first full minute's.

    python bench/reliability/sustained.py --duration 300 [--json [OUT]]
"""
from __future__ import annotations

import http.client
import random
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rel_harness import Client, Server, bench_main, read_rss_kib  # noqa: E402


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1)


class Traffic:
    """The load's client threads and a sampler of the workers' memory, until told to stop."""

    def __init__(self, server: Server, client: Client) -> None:
        self.server, self.client = server, client
        self.stop = threading.Event()
        self.samples: list[tuple[float, int]] = []           # (t, rss KiB summed over workers)
        self.lat: list[tuple[float, str, float, int]] = []   # (t, kind, seconds, status)
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.t0 = time.monotonic()

    def sampler(self) -> None:
        while not self.stop.is_set():
            rss = [read_rss_kib(p) for p in self.server.worker_pids()]
            self.samples.append((time.monotonic() - self.t0, sum(r for r in rss if r)))
            self.stop.wait(1.0)

    def worker(self, wseed: int) -> None:
        rng = random.Random(wseed)
        while not self.stop.is_set():
            kind = rng.choices(["plain", "stream", "background", "read"], weights=(3, 2, 2, 3))[0]
            start = time.monotonic()
            got = [0]  # the status, once the answer's head came (a stream may fail after it)
            try:
                self.request(rng, kind, got)
            except (OSError, http.client.HTTPException) as exc:
                with self.lock:
                    self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
            with self.lock:
                self.lat.append((start - self.t0, kind, time.monotonic() - start, got[0]))

    def request(self, rng: random.Random, kind: str, got: list[int]) -> None:
        """One request of ``kind``; its status into ``got[0]``."""
        client = self.client
        body = {"model": "demo", "input": f"Item {rng.randint(0, 10**6)}: describe it.",
                "max_output_tokens": rng.randint(8, 48), "temperature": 0.8, "seed": rng.randint(0, 2**31)}
        if kind == "plain":
            got[0] = client.post("/v1/responses", body, timeout=120).status
        elif kind == "stream":
            body["stream"] = True
            with client.stream("POST", "/v1/responses", body, timeout=120) as (got[0], _, events):
                for _ in events:
                    if rng.random() < 0.02:   # a client that goes away mid-stream
                        break
        elif kind == "background":
            body["background"] = True
            res = client.post("/v1/responses", body, timeout=120)
            got[0] = res.status
            if res.status == 202 and rng.random() < 0.3:
                client.post(f"/v1/responses/{res.body['id']}/cancel", {})
        else:
            got[0] = client.get("/v1/responses?limit=20").status


def run(workdir: Path, duration: float, clients: int, seed: int, rss_bound_mib: float,
        drift_bound: float, log=print) -> dict:
    server = Server(workdir / "data", log=workdir / "server.log")
    server.start()
    traffic: Traffic | None = None
    try:
        traffic = Traffic(server, server.pair(["responses:write", "responses:read"], name="sustained"))
        workers = server.worker_pids()
        threads = [threading.Thread(target=traffic.sampler, daemon=True)]
        threads += [threading.Thread(target=traffic.worker, args=(seed * 1000 + i,), daemon=True)
                    for i in range(clients)]
        for t in threads:
            t.start()
        while time.monotonic() - traffic.t0 < duration:
            time.sleep(5)
            server.check_alive()
            rss = traffic.samples[-1][1] // 1024 if traffic.samples else "?"
            log(f"{time.monotonic() - traffic.t0:.0f}s: {len(traffic.lat)} requests, rss {rss} MiB")
        traffic.stop.set()
        for t in threads:
            t.join(150)
        replaced = server.worker_pids() != workers
    finally:
        if traffic is not None:
            traffic.stop.set()
        server.stop()
    table = per_minute(traffic.lat, traffic.samples)
    samples = traffic.samples
    after_warmup = [rss for t, rss in samples if t >= 60] or [rss for _, rss in samples]
    growth = (max(after_warmup) - after_warmup[0]) / 1024 if after_warmup else None
    full = [r for r in table if r["plain_p50_ms"] is not None][:-1] or table   # the last minute may be partial
    drift = (full[-1]["plain_p50_ms"] / full[1]["plain_p50_ms"]) if len(full) > 2 else None
    return {
        "duration_s": round(duration), "clients": clients, "requests": len(traffic.lat),
        "errors": sum(r["errors"] for r in table), "first_errors": traffic.errors[:10],
        "worker_replaced": replaced,
        "rss_mib_after_warmup_first": round(after_warmup[0] / 1024, 1) if after_warmup else None,
        "rss_mib_after_warmup_max": round(max(after_warmup) / 1024, 1) if after_warmup else None,
        "rss_growth_mib": round(growth, 1) if growth is not None else None,
        "rss_bound_mib": rss_bound_mib,
        "rss_flat": growth is not None and growth < rss_bound_mib,
        "plain_p50_drift_ratio": round(drift, 2) if drift else None,
        "drift_bound": drift_bound,
        "latency_steady": drift is not None and drift < drift_bound,
        "per_minute": table,
    }


def per_minute(lat: list[tuple[float, str, float, int]], samples: list[tuple[float, int]]) -> list[dict]:
    """Requests, errors, plain and read latency and the workers' memory, minute by minute."""
    minutes: dict[int, dict] = defaultdict(lambda: {"lat": defaultdict(list), "n": 0, "errors": 0, "rss": []})
    for t, kind, secs, status in lat:
        m = minutes[int(t // 60)]
        m["n"] += 1
        if status == 0 or status >= 500:
            m["errors"] += 1
        else:
            m["lat"][kind].append(secs)
    for t, rss in samples:
        minutes[int(t // 60)]["rss"].append(rss)
    table = []
    for m in sorted(minutes):
        row = minutes[m]
        table.append({
            "minute": m + 1, "requests": row["n"], "errors": row["errors"],
            "plain_p50_ms": _pct(row["lat"]["plain"], 0.5), "plain_p95_ms": _pct(row["lat"]["plain"], 0.95),
            "plain_p99_ms": _pct(row["lat"]["plain"], 0.99),
            "read_p50_ms": _pct(row["lat"]["read"], 0.5), "read_p95_ms": _pct(row["lat"]["read"], 0.95),
            "rss_mib_max": round(max(row["rss"]) / 1024, 1) if row["rss"] else None,
        })
    return table


def main(argv: list[str] | None = None) -> int:
    def options(ap) -> None:
        ap.add_argument("--duration", type=float, default=300)
        ap.add_argument("--clients", type=int, default=4)
        ap.add_argument("--seed", type=int, default=1)
        ap.add_argument("--rss-bound-mib", type=float, default=16.0)
        ap.add_argument("--drift-bound", type=float, default=1.5)

    return bench_main(__doc__, argv, options,
                      lambda a, workdir, log: run(workdir, a.duration, a.clients, a.seed, a.rss_bound_mib,
                                                  a.drift_bound, log=log),
                      lambda s: not (s["rss_flat"] and s["latency_steady"]) or s["errors"])


if __name__ == "__main__":
    sys.exit(main())
