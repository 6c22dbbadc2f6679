#!/usr/bin/env python3
"""What a free slot between running sequences costs the engine's step.

With a KV stream per sequence (llama-server's ``--no-kv-unified``, the
engine's only layout) llama.cpp puts a run of consecutive sequence ids in
one ubatch: each further run is one more pass over the weights. A sequence
that ends between running ones splits their run in two until a new one takes
its slot. This measures, on the engine alone (no HTTP, no store), the steps
per second, the ubatches per step and the tokens per second of ``--parallel``
sequences all decoding, then of the same with one of them cancelled: the
first submitted, one in the middle or the last, or none (the control: the
same window, with sequences as long). A free slot between running ones gets
a filler row (csrc/batch_plan.cpp), counted per step. Then what a step
costs with the running slots laid out in runs apart, with free slots
between them filled or not ("layouts": what a pass and a filler row cost).
Then a closed loop like
the serving benchmark's: ``--clients`` sequences of 24-word chat prompts and
128 tokens, each replaced by a new one as soon as it ends, with
``--parallel`` slots, and the passes per step it took.

    python bench/ubatches.py [--models smollm2-135m-instruct] [--parallel 16] [--threads 2]

It writes ``bench/results/<time>-ubatches-<model>.json`` (``bench/results_path.py``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from results_path import write_result
from serving.servers import make_models

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
        "filler_rows_per_step": round((after["filler_rows"] - before["filler_rows"]) / max(steps, 1), 3),
        "tokens_per_s": round(tokens / wall, 2),
    }


@contextmanager
def decoding(model: Path, args, slots: int, sequences: int) -> Iterator[tuple[Any, list[int]]]:
    """A fresh engine of ``slots`` slots, ``sequences`` of them decoding (slots 0 on)."""
    from lmsp.native import Engine

    engine = Engine(str(model), n_ctx=1024, n_parallel=slots, n_threads=args.threads)
    try:
        prompt = engine.tokenize(PROMPT, add_special=True)
        yield engine, [engine.submit(prompt, max_tokens=1000, temperature=1.0, seed=i) for i in range(sequences)]
    finally:
        engine.close()


def one_case(model: Path, args, cancel: int | None) -> dict:
    """``args.parallel`` sequences decoding; then the ``cancel``-th cancelled (None: none)."""
    with decoding(model, args, args.parallel, args.parallel) as (engine, seqs):
        time.sleep(args.settle)
        engine.poll()
        out = {"all": rate(engine, args.seconds)}
        if cancel is not None:
            engine.cancel(seqs[cancel])
        time.sleep(0.2)
        engine.poll()
        # the control case ("none") measures the same window with none cancelled:
        # the sequences are longer by then, and each step attends to more
        out["one_free" if cancel is not None else "again"] = rate(engine, args.seconds)
        return out


# Which slots keep decoding (of 24, 22 started, the rest cancelled): runs of
# slots apart, with free slots between them that a filler row fills (up to
# two) or not (five).
LAYOUTS = {
    "1": [0],
    "2 adjacent": [0, 1],
    "2, 1 free between": [0, 2],
    "2, 5 free between": [0, 6],
    "4 adjacent": [0, 1, 2, 3],
    "15 adjacent": list(range(15)),
    "16 adjacent": list(range(16)),
    "16, 1 free between": list(range(8)) + list(range(9, 17)),
    "16, 2 free between": list(range(8)) + list(range(10, 18)),
    "16, 5 free between": list(range(8)) + list(range(13, 21)),
}


def layout(model: Path, args, keep: list[int]) -> dict:
    """Sequences decoding in the slots of ``keep`` of 24 (short sequences):
    milliseconds per step, passes and filler rows per step."""
    with decoding(model, args, 24, 22) as (engine, seqs):
        time.sleep(0.5)
        for i, seq in enumerate(seqs):
            if i not in keep:
                engine.cancel(seq)
        time.sleep(0.5)
        engine.poll()
        before, start = engine.stats(), time.monotonic()
        time.sleep(3.0)
        engine.poll()
        after, wall = engine.stats(), time.monotonic() - start
    steps = max(after["steps"] - before["steps"], 1)
    return {
        "ms_per_step": round(1000 * wall / steps, 2),
        "ubatches_per_step": round((after["ubatches"] - before["ubatches"]) / steps, 2),
        "filler_rows_per_step": round((after["filler_rows"] - before["filler_rows"]) / steps, 2),
    }


WORDS = "river stone lantern orbit velvet copper meadow signal harbor quartz ember falcon prism tundra cobalt".split()


def closed_loop(model: Path, args, requests: int) -> dict:
    """``args.clients`` sequences at a time until ``requests`` have ended; passes per step."""
    from lmsp.native import Engine

    engine = Engine(str(model), n_ctx=512, n_parallel=args.parallel, n_threads=args.threads, prefix_cache=False)

    def submit(i: int) -> int:
        words = " ".join(WORDS[(i * 7 + k * (i % 5 + 1)) % len(WORDS)] for k in range(24))
        prompt = engine.chat_prompt([{"role": "user", "content": words}])
        return engine.submit(prompt, max_tokens=128, temperature=1.0, seed=i)

    try:
        before, start = engine.stats(), time.monotonic()
        for i in range(args.clients):
            submit(i)
        ended, n = 0, args.clients
        while ended < requests:
            for result in engine.poll():
                if result.get("finish"):
                    ended += 1
                    submit(n)
                    n += 1
            time.sleep(0.002)
        after, wall = engine.stats(), time.monotonic() - start
    finally:
        engine.close()
    steps = after["steps"] - before["steps"]
    return {
        "clients": args.clients,
        "requests": requests,
        "steps": steps,
        "ubatches": after["ubatches"] - before["ubatches"],
        "ubatches_per_step": round((after["ubatches"] - before["ubatches"]) / max(steps, 1), 3),
        "filler_rows": after["filler_rows"] - before["filler_rows"],
        "tokens_per_s": round((after["tokens_generated"] - before["tokens_generated"]) / wall, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2-135m-instruct")
    p.add_argument("--parallel", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=6.0, help="measured decoding per case")
    p.add_argument("--settle", type=float, default=2.0, help="decoding before the first measure")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--clients", type=int, default=16, help="sequences at a time in the closed loop")
    p.add_argument("--out", type=Path, default=None,
                   help="the result file (default: bench/results/TIME-ubatches-MODEL.json)")
    args = p.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    started = time.time()
    cases = {"none": None, "first": 0, "middle": args.parallel // 2, "last": args.parallel - 1}
    models = []
    with tempfile.TemporaryDirectory(prefix="ubatches-") as tmp:
        for name, path in zip(names, make_models(names, [], Path(tmp))):
            rounds = []
            for r in range(args.rounds):
                for case, index in cases.items():
                    got = one_case(path, args, index)
                    rounds.append({"round": r, "cancelled": case, **got})
                    print(name, r, case, got, flush=True)
            layouts = {}
            for label, keep in LAYOUTS.items():
                layouts[label] = [layout(path, args, keep) for _ in range(args.rounds)]
                print(name, label, layouts[label], flush=True)
            loop = [closed_loop(path, args, 3 * args.clients) for _ in range(args.rounds)]
            print(name, "closed loop", loop, flush=True)
            models.append({"model": name, "rounds": rounds, "layouts": layouts, "closed_loop": loop})
    record = {
        "load_average_after": os.getloadavg(),
        "command": shlex.join([sys.executable, *sys.argv]),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "models": models,
    }
    write_result("ubatches", names, record, started=started, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
