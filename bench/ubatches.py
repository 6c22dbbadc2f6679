#!/usr/bin/env python3
"""What a free slot between running sequences costs the engine's step.

With a KV stream per sequence (llama-server's ``--no-kv-unified``, the
engine's only layout) llama.cpp puts a run of consecutive sequence ids in
one ubatch: each further run is one more pass over the weights. A sequence
that ends between running ones splits their run in two until a new one takes
its slot. This measures, on the engine alone (no HTTP, no store), the steps
per second, the ubatches per step and the tokens per second of ``--parallel``
sequences all decoding, then of the same with one of them cancelled: the
first submitted (a run stays whole), one in the middle (two runs) or the
last.

    python bench/ubatches.py [--models smollm2-135m-instruct] [--parallel 16] [--threads 2]

It writes ``bench/results/history/<time>-ubatches.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import serve

PROMPT = "Once upon a time, in a land far away, there lived"


def rate(engine, seconds: float) -> dict:
    """Steps/s, ubatches per step and tokens/s over ``seconds`` of decoding."""
    before, start, tokens = engine.stats(), time.monotonic(), 0
    while time.monotonic() - start < seconds:
        tokens += sum(len(r.get("tokens") or ()) for r in engine.poll())
        time.sleep(0.005)
    after, wall = engine.stats(), time.monotonic() - start
    steps = after["steps"] - before["steps"]
    return {
        "steps_per_s": round(steps / wall, 3),
        "ubatches_per_step": round((after["ubatches"] - before["ubatches"]) / max(steps, 1), 3),
        "tokens_per_s": round(tokens / wall, 2),
    }


def one_case(model: Path, args, cancel: int | None) -> dict:
    """A fresh engine, ``args.parallel`` sequences decoding; then the ``cancel``-th cancelled."""
    from lmsp.native import Engine

    engine = Engine(str(model), n_ctx=1024, n_parallel=args.parallel, n_threads=args.threads)
    try:
        prompt = engine.tokenize(PROMPT, add_special=True)
        seqs = [engine.submit(prompt, max_tokens=1000, temperature=1.0, seed=i) for i in range(args.parallel)]
        time.sleep(args.settle)
        engine.poll()
        out = {"all": rate(engine, args.seconds)}
        if cancel is not None:
            engine.cancel(seqs[cancel])
            time.sleep(0.2)
            engine.poll()
            out["one_free"] = rate(engine, args.seconds)
        return out
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2-135m-instruct")
    p.add_argument("--parallel", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=6.0, help="measured decoding per case")
    p.add_argument("--settle", type=float, default=2.0, help="decoding before the first measure")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="the result file (default: bench/results/history/...)")
    args = p.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cases = {"first": 0, "middle": args.parallel // 2, "last": args.parallel - 1}
    models = []
    with tempfile.TemporaryDirectory(prefix="ubatches-") as tmp:
        for name, path in zip(names, serve.make_models(names, [], Path(tmp))):
            rounds = []
            for r in range(args.rounds):
                for case, index in cases.items():
                    got = one_case(path, args, index)
                    rounds.append({"round": r, "cancelled": case, **got})
                    print(name, r, case, got, flush=True)
            models.append({"model": name, "rounds": rounds})
    here = Path(__file__).resolve().parent
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=here).stdout.strip()
    result = {
        "benchmark": "ubatches",
        "time": started,
        "commit": commit,
        "machine": serve.machine_line(),
        "load_average_after": os.getloadavg(),
        "command": shlex.join([sys.executable, *sys.argv]),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "models": models,
    }
    stamp = started[:13].replace(":", "") + started[14:16]
    out = args.out or here / "results" / "history" / f"{stamp}-ubatches.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
