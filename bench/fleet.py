#!/usr/bin/env python3
"""What the fleet's router costs: nginx (``lmsp fleet nginx``) in front of boxes on this machine.

    python bench/fleet.py                      # 16 and 64 clients, 20 s a figure, 3 rounds
    python bench/fleet.py --quick              # a smoke run: 4 clients, 2 s a figure, no result file

Three boxes (``lmsp serve``, the demo model unless ``--model``) and nginx run on loopback.
1. The router's own cost per request: ``GET /v1/responses/{id}`` straight to the id's box
   against the same through nginx, interleaved; the p50 and p90 of each and their difference.
2. The forwarding hop: a turn naming an earlier response, sent to the box that holds it
   against sent to another box, which forwards it (p50 of each).
3. Tokens/s of 1, 2 and 3 boxes behind nginx at each client count (clients making plain
   responses), and of box a reached directly: the ratio of 1 box through nginx to it is the
   router's share of tokens/s. The boxes share this machine's cores, so more boxes need not
   mean more tokens/s here.

Results go to ``bench/results/`` (``results_path.py``); ``--quick`` writes none.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "reliability"))
from fleet_harness import Fleet, owner  # noqa: E402
from rel_harness import Client  # noqa: E402
from results_path import write_result  # noqa: E402


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": round(statistics.median(ordered) * 1000, 3),
            "p90_ms": round(ordered[int(len(ordered) * 0.9) - 1] * 1000, 3), "n": len(ordered)}


def timed(call) -> float:
    started = time.perf_counter()
    got = call()
    elapsed = time.perf_counter() - started
    if got.status >= 400:
        raise RuntimeError(f"a request failed: {got.status} {got.body}")
    return elapsed


def router_cost(fleet: Fleet, client: Client, n: int, model: str) -> dict:
    made = fleet.direct(client, "a").post("/v1/responses", {"model": model, "input": "x", "max_output_tokens": 2})
    rid = made.body["id"]
    direct, routed = fleet.direct(client, owner(rid)), fleet.router(client)
    a, b = [], []
    for _ in range(n):
        a.append(timed(lambda: direct.get(f"/v1/responses/{rid}")))
        b.append(timed(lambda: routed.get(f"/v1/responses/{rid}")))
    out = {"direct": quantiles(a), "through_nginx": quantiles(b)}
    out["added_p50_ms"] = round(out["through_nginx"]["p50_ms"] - out["direct"]["p50_ms"], 3)
    return out


def forward_cost(fleet: Fleet, client: Client, n: int, model: str) -> dict:
    first = fleet.direct(client, "a").post("/v1/responses", {"model": model, "input": "x", "max_output_tokens": 1})
    body = {"model": model, "input": "y", "max_output_tokens": 1, "previous_response_id": first.body["id"]}
    at_owner, elsewhere = fleet.direct(client, "a"), fleet.direct(client, "b")
    a = [timed(lambda: at_owner.post("/v1/responses", body)) for _ in range(n)]
    b = [timed(lambda: elsewhere.post("/v1/responses", body)) for _ in range(n)]
    return {"at_owner": quantiles(a), "forwarded": quantiles(b),
            "added_p50_ms": round(statistics.median(b) * 1000 - statistics.median(a) * 1000, 3)}


def tokens_per_second(client: Client, clients: int, seconds: float, model: str, tokens: int) -> float:
    done: list[int] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def loop(n: int) -> None:
        while time.monotonic() < stop_at:
            got = client.post("/v1/responses", {"model": model, "input": f"client {n}", "max_output_tokens": tokens})
            if got.status == 200:
                with lock:
                    done.append(got.body["usage"]["output_tokens"])

    started = time.monotonic()
    threads = [threading.Thread(target=loop, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return round(sum(done) / (time.monotonic() - started), 2)


def throughput(fleet: Fleet, client: Client, args: argparse.Namespace) -> dict:
    """Tokens/s of box a reached directly and of 1, 2 and 3 boxes behind nginx, in
    ``--rounds`` rounds whose order alternates (the machine's load drifts): each figure
    the median round, the ratio of 1 box through nginx to box a the median of the
    rounds' ratios."""
    routers = {n: fleet.start_nginx(["a", "b", "c"][:n]) for n in (1, 2, 3)}
    targets = {"direct_a": fleet.direct(client, "a")}
    for n, port in routers.items():
        targets[f"nginx_{n}_boxes"] = Client("127.0.0.1", port, client.token, 120.0, client.client_id, client.scopes)
    out: dict = {}
    for clients in args.clients:
        rounds: list[dict[str, float]] = []
        for r in range(args.rounds):
            names = list(targets) if r % 2 == 0 else list(reversed(targets))
            rounds.append({name: tokens_per_second(targets[name], clients, args.seconds, args.model, args.tokens)
                           for name in names})
        row: dict = {name: statistics.median(got[name] for got in rounds) for name in targets}
        row["nginx_1_box_over_direct"] = round(
            statistics.median(got["nginx_1_boxes"] / got["direct_a"] for got in rounds if got["direct_a"]), 4)
        row["rounds"] = rounds
        out[str(clients)] = row
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: small figures, no result file")
    ap.add_argument("--model", default="demo", help="the model id the boxes serve (default: the demo model)")
    ap.add_argument("--requests", type=int, default=400, help="requests per latency figure")
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds per tokens/s figure")
    ap.add_argument("--tokens", type=int, default=32, help="max_output_tokens of each response")
    ap.add_argument("--clients", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the tokens/s figures, in alternating order")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.seconds, args.clients, args.rounds = 30, 2.0, [4], 1
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="lmsp-fleet-") as root:
        fleet = Fleet(Path(root))
        try:
            fleet.start()
            client = fleet.pair("a", "bench")
            record = {
                "router_cost": router_cost(fleet, client, args.requests, args.model),
                "forward_cost": forward_cost(fleet, client, max(args.requests // 4, 10), args.model),
                "tokens_per_second": throughput(fleet, client, args),
                "settings": dict(vars(args)),
            }
        finally:
            fleet.stop()
    print(json.dumps(record, indent=1))
    if not args.quick:
        write_result("fleet", args.model, record, started=started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
