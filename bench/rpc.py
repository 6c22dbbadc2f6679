#!/usr/bin/env python3
"""A model split over ``lmsp rpc-server`` processes on loopback against the same
model on one engine: what ggml's RPC transport costs.

    python bench/rpc.py                       # both catalog models, 1 and 16 clients
    python bench/rpc.py --quick               # SmolLM2, few tokens: a check that it all works

Three setups, each with the model's layers in one engine (this process):
``local`` (all layers here), ``split1`` (this box's share 1, one server's 1)
and ``split2`` (this box 1, two servers 1 each: thirds). The layers of a split
run one place after another, never at once, so every place gets ``--threads``
threads (2 by default) and the machine has that many busy at any time: the
split costs only the transport. At each client count K, K sequences decode
together (one engine with n_parallel=K), greedy, from distinct prompts:

    tok/s      tokens generated after every sequence had its first token, over
               the time that took (aggregate)
    ttft ms    the mean of the sequences' first-token times (submit to first token)
    ms/step    wall time of one decode step (one token of each sequence)
    bytes/tok  bytes the servers' connections carried both ways over the run
               (``ss``'s TCP counters) per generated token

Each figure of a split is also given as a ratio against ``local`` measured in
the same run, and the transport's cost per token as the difference of ms/step
over K. The machine must be otherwise idle. The result goes to
``bench/results/<time>-rpc-<models>.json`` (bench/results_path.py).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))  # rpc_servers: the test suite's rpc-server processes

from results_path import git_state, machine, result_path, utc  # noqa: E402
from rpc_servers import RpcServer  # noqa: E402

from lmsp.models.catalog import ensure_model  # noqa: E402
from lmsp.native import Engine  # noqa: E402

MODELS = ["smollm2-135m-instruct", "gemma-3-270m"]
SETUPS = {"local": 0, "split1": 1, "split2": 2}
TOPICS = ["the sea", "a lighthouse", "the moon", "bread", "rivers", "trains", "a garden", "snow"]


def prompts(engine: Engine, k: int, first: int) -> list[list[int]]:
    return [engine.chat_prompt([{"role": "user", "content": f"Write a long story about {TOPICS[i % 8]} ({i})."}])
            for i in range(first, first + k)]


def run_level(engine: Engine, k: int, tokens: int, first: int = 0) -> dict:
    """K greedy sequences at once: aggregate tok/s after all started, mean TTFT, ms/step."""
    seqs = [engine.submit(p, max_tokens=tokens, temperature=0) for p in prompts(engine, k, first)]
    started: set[int] = set()
    done: dict[int, dict] = {}
    counted, t_all = 0, 0.0
    while len(done) < k:
        engine.wait(60)
        for r in engine.poll():
            if r["tokens"] and r["seq"] not in started:
                started.add(r["seq"])
                if len(started) == k:
                    t_all = time.perf_counter()
            elif len(started) == k:
                counted += len(r["tokens"])
            if r["finish"] is not None:
                done[r["seq"]] = r
    elapsed = time.perf_counter() - t_all
    ttft = sum(done[s]["timings"].get("first_token_ms", 0.0) for s in seqs) / k
    steps = counted / k
    return {"tok_s": counted / elapsed if elapsed > 0 else 0.0, "ttft_ms": ttft,
            "ms_step": 1000 * elapsed / steps if steps else 0.0, "tokens": counted}


def io_bytes(servers: list[RpcServer]) -> int:
    """Bytes the servers' established connections sent and received so far (``ss``'s TCP info)."""
    total = 0
    for s in servers:
        out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{s.port} )"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        total += sum(int(n) for n in re.findall(r"bytes_(?:sent|received):(\d+)", out))
    return total


def measure(path: Path, setup: str, servers: list[RpcServer], args) -> dict:
    used = servers[:SETUPS[setup]]
    split = {"rpc_servers": [s.address for s in used], "tensor_split": [1.0] * (len(used) + 1)} if used else {}
    out = {}
    for k in args.clients:
        engine = Engine(str(path), n_ctx=1024, n_parallel=k, n_threads=args.threads, prefix_cache=False, **split)
        try:
            run_level(engine, k, 4, first=100)  # warm-up, on other prompts
            before = io_bytes(used)
            figures = run_level(engine, k, args.tokens)
            figures["bytes_per_token"] = (io_bytes(used) - before) / max(figures["tokens"], 1) if used else 0
            out[str(k)] = figures
        finally:
            engine.close()
            del engine  # the model goes with the object, and with it the connections to the servers
        print(f"  {setup:7} K={k:<3} {figures['tok_s']:8.1f} tok/s  ttft {figures['ttft_ms']:7.1f} ms  "
              f"{figures['ms_step']:6.2f} ms/step  {figures['bytes_per_token']:9.0f} B/tok", flush=True)
    return out


def compare(figures: dict) -> dict:
    """Each split against local: tok/s and TTFT ratios, transport ms per token (ms/step over K)."""
    out = {}
    for setup in ("split1", "split2"):
        for k, got in figures[setup].items():
            ref = figures["local"][k]
            out[f"{setup}@{k}"] = {
                "tok_s_ratio": got["tok_s"] / ref["tok_s"] if ref["tok_s"] else None,
                "ttft_ratio": got["ttft_ms"] / ref["ttft_ms"] if ref["ttft_ms"] else None,
                "transport_ms_per_token": (got["ms_step"] - ref["ms_step"]) / int(k),
            }
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--clients", default="1,16")
    p.add_argument("--tokens", type=int, default=64, help="tokens per sequence")
    p.add_argument("--threads", type=int, default=2, help="threads of each place (they compute in turn)")
    p.add_argument("--quick", action="store_true", help="SmolLM2, 1 and 2 clients, 8 tokens")
    p.add_argument("--out", default=None, help="the result file (default: bench/results/)")
    args = p.parse_args()
    if args.quick:
        args.models, args.clients, args.tokens = MODELS[0], "1,2", 8
    args.clients = [int(c) for c in args.clients.split(",")]
    models = args.models.split(",")
    work = Path("/tmp") / f"lmsp-bench-rpc-{time.time_ns()}"
    work.mkdir(parents=True)
    servers = [RpcServer(work, threads=args.threads).start() for _ in range(2)]
    result = {"kind": "rpc", "when": utc(), "git": git_state(), "machine": machine(), "threads": args.threads,
              "clients": args.clients, "tokens": args.tokens, "models": {}}
    try:
        for name in models:
            path = ensure_model(name)
            print(f"{name}:", flush=True)
            figures = {setup: measure(path, setup, servers, args) for setup in SETUPS}
            result["models"][name] = {"figures": figures, "against_local": compare(figures)}
            print(json.dumps(result["models"][name]["against_local"], indent=1), flush=True)
    finally:
        for s in servers:
            s.stop()
    out = Path(args.out) if args.out else result_path("rpc", models)
    if not args.quick or args.out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
