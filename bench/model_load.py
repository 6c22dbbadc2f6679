#!/usr/bin/env python3
"""What reading a model into memory costs against mapping it (the ``mmap`` setting),
and what putting the weights read into huge pages costs at the load.

    python bench/model_load.py                       # the demo model
    python bench/model_load.py MODEL.gguf [...]      # and/or any GGUF files
    python bench/model_load.py --reps 7 --tokens 32 MODEL.gguf

For each file and each way (``read``: use_mmap=False, the default, the weights
in huge pages where the system has them; ``small``: read, huge_pages=False;
``mmap``: use_mmap=True), ``--reps`` fresh processes each load the model once
(``lmsp.native.Engine``, one sequence, 512 tokens of context), then generate
``--tokens`` greedy tokens. Each reports:

    load s       the Engine constructor's wall time
    huge s       then the time until the engine's thread has collapsed the weights into
                 huge pages (info["huge_pages_pending"] false)
    huge MiB     the weights in huge pages then (info["weights_in_huge_pages"])
    base MiB     the process's resident memory before the load (Python, the extension)
    rss MiB      the process's resident memory after the load, split into
                 anonymous (its own: weights read, KV cache, buffers) and file
                 (pages of mapped files, shared with the page cache)
    after gen    the same after the generation, which touches every weight

The file is read once before the runs, so every run finds it in the page cache
(the usual case for a model loaded again); a cold cache adds the disk's read
time to both ways, to ``read`` at load and to ``mmap`` at the first requests.
The medians go to stdout as a table; ``--json`` prints every run. Every run also
goes to ``bench/results/<time>-model_load-<models>.json`` (``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_path import write_result  # noqa: E402

MODES: dict[str, dict[str, bool]] = {
    "read": {"use_mmap": False},
    "small": {"use_mmap": False, "huge_pages": False},
    "mmap": {"use_mmap": True},
}


def _memory() -> dict[str, float]:
    """Resident memory of this process in MiB: total, anonymous, file-backed."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / 1024.0
    return {"rss": out.get("VmRSS", 0.0), "anon": out.get("RssAnon", 0.0), "file": out.get("RssFile", 0.0)}


def child(path: str, way: dict[str, bool], tokens: int) -> dict:
    """One measurement in this (fresh) process."""
    import time

    from lmsp import native

    before = _memory()
    started = time.perf_counter()
    engine = native.Engine(path, n_ctx=512, n_parallel=1, n_threads=os.cpu_count() or 1, **way)
    load_s = time.perf_counter() - started
    while engine.info["huge_pages_pending"]:
        time.sleep(0.005)
    huge_s = time.perf_counter() - started - load_s
    huge_mib = engine.info["weights_in_huge_pages"] / 2**20
    loaded = _memory()
    prompt = engine.tokenize("Once upon a time", True, False)
    engine.submit(prompt, max_tokens=tokens, temperature=0.0)
    while not any(r.get("finish") for r in engine.poll()):
        engine.wait(1.0)
    generated = _memory()
    engine.close()
    return {"load_s": load_s, "huge_s": huge_s, "huge_mib": huge_mib, "before": before, "loaded": loaded,
            "generated": generated}


def _run_child(path: Path, mode: str, tokens: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(path), mode, str(tokens)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _warm(path: Path) -> None:
    with open(path, "rb") as fh:
        while fh.read(1 << 24):
            pass


def _median(runs: list[dict], *keys: str) -> float:
    values = []
    for run in runs:
        value = run
        for key in keys:
            value = value[key]
        values.append(value)
    return statistics.median(values)


def bench(paths: list[Path], reps: int, tokens: int) -> list[dict]:
    results = []
    for path in paths:
        _warm(path)
        runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for _ in range(reps):  # the ways take turns, so that both see the same machine
            for mode in MODES:
                runs[mode].append(_run_child(path, mode, tokens))
        for mode, done in runs.items():
            results.append({"model": path.name, "size_mib": path.stat().st_size / 2**20, "mode": mode,
                            "runs": done, "load_s": _median(done, "load_s"), "huge_s": _median(done, "huge_s"),
                            "huge_mib": _median(done, "huge_mib"),
                            "base": _median(done, "before", "rss"),
                            "loaded": {k: _median(done, "loaded", k) for k in ("rss", "anon", "file")},
                            "generated": {k: _median(done, "generated", k) for k in ("rss", "anon", "file")}})
    return results


def table(results: list[dict]) -> str:
    lines = [f"{'model':<34} {'MiB':>6} {'way':<5} {'load s':>7} {'huge s':>6} {'MiB':>6} {'base':>6} {'rss':>7} "
             f"{'anon':>7} {'file':>7}"
             f" | after gen: {'rss':>7} {'anon':>7} {'file':>7}"]
    for r in results:
        lo, ge = r["loaded"], r["generated"]
        lines.append(f"{r['model']:<34} {r['size_mib']:>6.1f} {r['mode']:<5} {r['load_s']:>7.3f} {r['huge_s']:>6.2f} "
                     f"{r['huge_mib']:>6.1f} {r['base']:>6.1f} "
                     f"{lo['rss']:>7.1f} {lo['anon']:>7.1f} {lo['file']:>7.1f} | "
                     f"{'':>11}{ge['rss']:>7.1f} {ge['anon']:>7.1f} {ge['file']:>7.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        path, mode, tokens = argv[1], argv[2], int(argv[3])
        print(json.dumps(child(path, MODES[mode], tokens)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", type=Path, help="GGUF files (default: the demo model)")
    parser.add_argument("--reps", type=int, default=5, help="fresh processes per file and way (default 5)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens generated after the load (default 16)")
    parser.add_argument("--json", action="store_true", help="print every run as JSON instead of the table")
    parser.add_argument("--out", type=Path, default=None,
                        help="the result file (default: bench/results/TIME-model_load-MODELS.json)")
    args = parser.parse_args(argv)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        paths = list(args.models)
        if not paths:
            from lmsp.models.demo import write_demo_model

            paths = [Path(write_demo_model(Path(tmp) / "demo-tiny.gguf"))]
        results = bench(paths, args.reps, args.tokens)
    print(json.dumps(results, indent=1) if args.json else table(results))
    models = [p.stem for p in args.models] or ["tiny"]
    write_result("model_load", models, {"command": shlex.join([sys.executable, *sys.argv]), "runs": results},
                 started=started, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
