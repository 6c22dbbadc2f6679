#!/usr/bin/env python3
"""The engine on a GPU in fresh processes, each set up one way the service or
the tests set up theirs: a load and an 8-token greedy generation per case.

    python bench/gpu_smoke.py MODEL.gguf [--n-gpu-layers 99]

Prints one line per case (its exit status and last line of output) and exits 1
when any case failed. Written after a crash that only a process which had
imported gevent first met (bench/results/20261130T001400Z-serve_h200_crash-none.json).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

PROGRAM = """
{setup}
from lmsp.native import Engine

def generate():
    with Engine({model!r}, n_ctx=512, n_parallel=4, n_threads={threads}, n_gpu_layers={ngl}) as engine:
        seq = engine.submit([1, 100, 200, 300], max_tokens=8, temperature=0.0)
        while True:
            engine.wait(5.0)
            if any(r["seq"] == seq and r["finish"] for r in engine.poll()):
                break
        print("ok on", engine.info["backend"], flush=True)

{call}
"""

CASES = {
    "plain": dict(setup=""),
    "four threads": dict(setup="", threads=4),
    "gevent imported first": dict(setup="import gevent, gevent.socket"),
    "faulthandler on": dict(setup="import faulthandler; faulthandler.enable()"),
    "system_info first": dict(setup="import lmsp.native; lmsp.native.system_info()"),
    "in a thread": dict(setup="import threading",
                        call="t = threading.Thread(target=generate); t.start(); t.join()"),
    "llama.cpp log on": dict(setup="import lmsp.native; lmsp.native.set_logging(True)"),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--n-gpu-layers", type=int, default=99)
    args = p.parse_args()
    failed = 0
    for name, case in CASES.items():
        source = PROGRAM.format(model=args.model, ngl=args.n_gpu_layers, setup=case["setup"],
                                threads=case.get("threads", 1), call=case.get("call", "generate()"))
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=120)
            rc, said = proc.returncode, proc.stdout
            out = (proc.stdout + proc.stderr).strip().splitlines()
        except subprocess.TimeoutExpired:
            rc, said, out = "timeout", "", []
        good = rc == 0 and "ok on" in said
        failed += not good
        last = out[-1][:160] if out else ""
        print(f"{'ok  ' if good else 'FAIL'} {name:22s} exit {rc}  {time.perf_counter() - start:5.1f} s  {last}",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
