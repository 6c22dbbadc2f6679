#!/usr/bin/env python3
"""Native engine benchmark: the lmsp extension against llama.cpp's llama-bench.

Both run the same model, on the same machine, taking turns, with the same
thread count and GPU layers: by default the catalog's SmolLM2 135M Instruct
(Q4_1) and Gemma 3 270M (Q4_K_M), fetched into the cache on first use
(``bench/bench_models.py``); its demo shapes (random weights) by name.
llama-bench comes from the same pinned llama.cpp source
(``bench/build_reference.sh``).

    python bench/native.py                      # the catalog models, a few minutes on 2 cores
    python bench/native.py --quick              # tiny model, short runs (a check that it all works)
    python bench/native.py --models bench --n-gpu-layers 99 --threads 16

What is measured:
    pp<N>      prefill tokens/s of one N-token prompt. llama-bench: its ``-p N``
               test (one llama_decode of N tokens). lmsp: ``submit(prompt,
               max_tokens=1)`` with ``prefill_chunk=N``, N / the engine's
               prompt time (admission to the first sampled token).
    tg<N>      generation tokens/s of one sequence. llama-bench: its ``-n N``
               test (N single-token decodes, no sampling). lmsp: a short
               text prompt, N greedy tokens; (tokens after the first) / (time after
               the first), as the engine's timings report it, so sampling,
               detokenising and handing results to Python are included. The
               Python consumer is woken for every token.
    tg<N> windowed  the same, with the consumer woken as the service's commit
               thread is: by the first text and by the end (the engine's
               urgent results), otherwise once per 4 ms commit window.
    tg<N> xK   lmsp only: K sequences decoded together (one engine with
               n_parallel=K); aggregate tokens/s = tokens generated after
               every sequence had its first token / the time that took.
llama-bench runs twice: "matched" uses the llama.cpp settings the engine uses
(no weight repacking; on the CPU flash attention with f16 K and V caches,
whose tiled kernel llama-bench takes for the prompt as the engine does; on a
GPU flash attention off: see csrc/batch_plan.cpp; with ``--no-batch-invariant``
repacking too, as the engine then has),
"default" uses llama-bench's own defaults. llama-bench and the engine take turns, one
repetition each, so that both see the same machine when other work comes and
goes. Every figure is the mean over ``--reps`` repetitions (each after a
warm-up), with the standard deviation. The table goes to
stdout and everything (with the raw llama-bench records) to
``bench/results/<time>-native-<models>.json`` (``--results-dir``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_models import DEFAULT_MODELS
from results_path import RESULTS, git_state, result_path
from lmsp.config import Config

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LLAMA_BENCH = ROOT / "build" / "reference" / "bin" / "llama-bench"
DEFAULT_OUT = ROOT / "bench" / "out"
BOS = 1
N_BATCH = 512
COMMIT_WINDOW_S = Config.commit_window_ms / 1000.0  # the service's default window


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=DEFAULT_MODELS,
                   help="catalog models or demo shapes, comma separated (default: %(default)s; "
                        "the demo 'tiny' is a micro-benchmark of the engine's own overhead)")
    p.add_argument("--model-file", type=Path, action="append", default=[],
                   help="also benchmark this GGUF file (repeatable)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--n-gpu-layers", type=int, default=0)
    p.add_argument("--no-batch-invariant", dest="batch_invariant", action="store_false",
                   help="run the engine with batch_invariant=False (llama.cpp's faster CPU kernels); "
                        "the matched llama-bench run then uses the same cache types and repacking")
    p.add_argument("--no-huge-pages", dest="huge_pages", action="store_false",
                   help="keep the engine's weights in small pages (Engine(huge_pages=False)), as llama-bench's are")
    p.add_argument("--n-prompt", type=int, default=512)
    p.add_argument("--n-gen", type=int, default=128)
    p.add_argument("--parallel", default="1,2,4,8",
                   help="sequence counts for the aggregate generation test (default: 1,2,4,8)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of each test (default: 3)")
    p.add_argument("--llama-bench", type=Path, default=DEFAULT_LLAMA_BENCH)
    p.add_argument("--llama-bench-configs", default="matched,default",
                   help="llama-bench settings to run: matched, default or both (default: both)")
    p.add_argument("--no-llama-bench", action="store_true",
                   help="measure the extension only (no ratios)")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="work folder (the demo models)")
    p.add_argument("--results-dir", type=Path, default=RESULTS, help="where the result file goes")
    p.add_argument("--remake-models", action="store_true",
                   help="write the demo models again even if they exist")
    p.add_argument("--quick", action="store_true",
                   help="tiny model, 1 repetition, pp128/tg32, 1,2,4 sequences")
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.reps, args.n_prompt, args.n_gen, args.parallel = "tiny", 1, 128, 32, "1,2,4"
    try:
        args.parallel = sorted({int(x) for x in args.parallel.split(",") if x.strip()})
    except ValueError:
        p.error(f"--parallel must be comma-separated integers, got {args.parallel!r}")
    for name in ("threads", "n_prompt", "n_gen", "reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.parallel or args.parallel[0] < 1:
        p.error("--parallel needs positive sequence counts")
    if args.n_prompt > N_BATCH:
        p.error(f"--n-prompt is at most {N_BATCH} (one batch)")
    if args.n_gen < 2:
        p.error("--n-gen must be at least 2")
    args.models = [m for m in args.models.split(",") if m.strip()]
    args.llama_bench_configs = [c for c in args.llama_bench_configs.split(",") if c.strip()]
    unknown = set(args.llama_bench_configs) - set(LLAMA_BENCH_CONFIGS)
    if unknown or not args.llama_bench_configs:
        p.error(f"--llama-bench-configs takes {', '.join(LLAMA_BENCH_CONFIGS)}")
    return args


# ---------------------------------------------------------------- helpers

def mean_std(values: list[float]) -> dict:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "samples": values,
    }


def paired_ratio(ours: dict, ref: dict) -> float:
    """lmsp / reference: the median of the ratios of the repetitions, each
    pair measured back to back (slow drift of the machine cancels out), or the
    ratio of the means where the samples do not pair up."""
    a, b = ours.get("samples") or [], ref.get("samples") or []
    if a and len(a) == len(b):
        return statistics.median(x / y for x, y in zip(a, b))
    return ours["mean"] / ref["mean"]


def fmt(stat: dict | None) -> str:
    if not stat:
        return "-"
    return f"{stat['mean']:.1f} ± {stat['std']:.1f}"


def fmt_load(load: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in load)


def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cores": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def make_models(args: argparse.Namespace) -> list[tuple[str, Path]]:
    from bench_models import resolve

    found = resolve(args.models, args.model_file, args.out_dir / "models", args.remake_models)
    return [(m.name, m.path) for m in found]


# ---------------------------------------------------------------- llama-bench

def matched_config(args: argparse.Namespace) -> str:
    if args.n_gpu_layers:
        return "matched-gpu"
    return "matched" if args.batch_invariant else "matched-fast"


LLAMA_BENCH_CONFIGS = {
    # the engine's llama.cpp settings (csrc/batch_plan.cpp): on the CPU flash
    # attention over f16 K and V caches (the engine's batch of 512 allows its
    # tiled prompts), no repacking; on a GPU flash attention off
    "matched": ["-fa", "1", "-ctk", "f16", "-ctv", "f16", "--repack", "0"],
    "matched-gpu": ["-fa", "0", "--repack", "0"],
    # --no-batch-invariant: f16 K and V (the tiled and split-KV kernels), repacked weights
    "matched-fast": ["-fa", "1", "-ctk", "f16", "-ctv", "f16", "--repack", "1"],
    "default": [],
}


def run_llama_bench(args: argparse.Namespace, model: Path, config: str, warmup: bool) -> dict:
    """One repetition of llama-bench's prompt and generation tests."""
    cmd = [str(args.llama_bench), "-m", str(model), "-p", str(args.n_prompt), "-n", str(args.n_gen),
           "-t", str(args.threads), "-r", "1", "-ngl", str(args.n_gpu_layers),
           "-b", str(N_BATCH), "-ub", str(N_BATCH), "-o", "json",
           *LLAMA_BENCH_CONFIGS[matched_config(args) if config == "matched" else config]]
    if not warmup:
        cmd.append("--no-warmup")
    print(f"# {shlex.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    records = json.loads(proc.stdout)
    out: dict = {"command": shlex.join(cmd), "records": records}
    for rec in records:
        key = f"pp{rec['n_prompt']}" if rec["n_gen"] == 0 else f"tg{rec['n_gen']}"
        out[key] = [float(x) for x in rec["samples_ts"]]
    return out


# ---------------------------------------------------------------- the extension

def _drain(engine, seqs: set[int], deadline_s: float = 600.0, window_s: float | None = None) -> dict[int, dict]:
    """Poll until every sequence in ``seqs`` has finished; per sequence: the
    wall time of its first token and of its end, and its last result.

    Without ``window_s`` the consumer is woken for every result, as a client
    streaming the engine's tokens one by one would be. With it, it takes them
    the way the service's commit thread does: woken by a first text or an
    end (urgent results), otherwise once per window."""
    state = {s: {"first": None, "end": None, "last": None} for s in seqs}
    left = set(seqs)
    start = time.perf_counter()
    while left:
        if time.perf_counter() - start > deadline_s:
            raise RuntimeError(f"sequences {sorted(left)} did not finish in {deadline_s:.0f} s")
        if window_s is None:
            engine.wait(1.0)
        else:
            engine.wait(window_s, urgent=True)
        for res in engine.poll():
            st = state.get(res["seq"])
            if st is None:
                continue
            now = time.perf_counter()
            if st["first"] is None and res["tokens"]:
                st["first"] = now
            if res["finish"] is not None:
                if res["finish"] == "error":
                    raise RuntimeError(f"sequence {res['seq']} failed: {res['error']}")
                st["end"], st["last"] = now, res
                left.discard(res["seq"])
    return state


def _prompt(n: int, salt: int) -> list[int]:
    import numpy as np

    rng = np.random.default_rng(1000 + salt)
    return [BOS] + rng.integers(3, 32000, size=n - 1).tolist()


def _story(engine, k: int) -> list[int]:
    """A short text to continue, through the model's own tokenizer (a real model
    ends a sequence of two arbitrary tokens at once)."""
    return engine.tokenize(f"Chapter {k}. The river ran past the old mill, and", add_special=True)


def _settled(engine) -> None:
    """Waits until the engine's weights are in huge pages (or it gave up): a
    steady state to measure, without its paced collapse thread beside it."""
    deadline = time.monotonic() + 300
    while engine.info.get("huge_pages_pending") and time.monotonic() < deadline:
        time.sleep(0.05)


def bench_prefill(args: argparse.Namespace, model: Path, reps: int) -> list[float]:
    from lmsp.native import Engine

    rates = []
    with Engine(str(model), n_ctx=args.n_prompt + 8, n_parallel=1, n_threads=args.threads,
                n_gpu_layers=args.n_gpu_layers, n_batch=N_BATCH, prefill_chunk=args.n_prompt,
                batch_invariant=args.batch_invariant, huge_pages=args.huge_pages) as engine:
        _settled(engine)
        for rep in range(reps + 1):  # the first, shorter, is the warm-up
            n = args.n_prompt if rep else min(args.n_prompt, 64)
            seq = engine.submit(_prompt(n, rep), max_tokens=1, temperature=0.0)
            last = _drain(engine, {seq})[seq]["last"]
            prompt_ms = last["timings"]["prompt_ms"]
            if rep:
                rates.append(args.n_prompt / (prompt_ms / 1000.0))
    return rates


def bench_generation(args: argparse.Namespace, model: Path, n_seqs: int, reps: int,
                     window_s: float | None = None) -> tuple[list[float], int]:
    from lmsp.native import Engine

    rates, early = [], 0
    with Engine(str(model), n_ctx=args.n_gen + 64, n_parallel=n_seqs, n_threads=args.threads,
                n_gpu_layers=args.n_gpu_layers, n_batch=N_BATCH, prefill_chunk=N_BATCH,
                batch_invariant=args.batch_invariant, huge_pages=args.huge_pages) as engine:
        _settled(engine)
        for rep in range(reps + 1):  # the first, shorter, is the warm-up
            max_tokens = args.n_gen if rep else min(args.n_gen, 16)
            seqs = {engine.submit(_story(engine, 100 + 7 * i + rep), max_tokens=max_tokens, temperature=0.0)
                    for i in range(n_seqs)}
            state = _drain(engine, seqs, window_s=window_s)
            if not rep:
                continue
            lasts = [st["last"] for st in state.values()]
            early += sum(1 for last in lasts if last["n_generated"] < args.n_gen)
            if n_seqs == 1:
                # the engine's own clock: first token -> finish
                last = lasts[0]
                rates.append((last["n_generated"] - 1) / (last["timings"]["decode_ms"] / 1000.0))
            else:
                # a sequence that ended on its first token (end of text) has no first token
                all_started = max(st["first"] or st["end"] for st in state.values())
                ended = max(st["end"] for st in state.values())
                # tokens generated after every sequence had its first one
                tokens = sum(last["n_generated"] for last in lasts) - n_seqs
                rates.append(tokens / (ended - all_started))
    return rates, early


# ---------------------------------------------------------------- main

def measure_model(args: argparse.Namespace, path: Path, pp: str, tg: str) -> dict:
    """One model: llama-bench (each configuration) and the engine taking turns, one
    repetition each, so that both see the same machine when other work comes and goes;
    then the engine alone with K sequences together."""
    entry: dict = {"path": str(path), "size_bytes": path.stat().st_size, "llama_bench": {}, "lmsp": {}}
    configs = [] if args.no_llama_bench else args.llama_bench_configs
    # llama-bench and the engine take turns, one repetition each, so that
    # both see the same machine when other work comes and goes
    lb = {c: {pp: [], tg: [], "commands": []} for c in configs}
    tgw = f"{tg} windowed"
    ours: dict[str, list[float]] = {pp: [], tg: [], tgw: []}
    early = 0
    for rep in range(args.reps):
        for config in configs:
            # on a GPU every llama-bench process pays for its own CUDA and
            # cuBLAS start-up in its first test: it always warms up there
            run = run_llama_bench(args, path, config, warmup=rep == 0 or args.n_gpu_layers != 0)
            lb[config][pp] += run[pp]
            lb[config][tg] += run[tg]
            lb[config]["commands"].append({"command": run["command"], "records": run["records"]})
        print(f"# lmsp {pp}, {tg} (repetition {rep + 1}/{args.reps})", flush=True)
        ours[pp] += bench_prefill(args, path, 1)
        rates, n = bench_generation(args, path, 1, 1)
        ours[tg] += rates
        early += n
        rates, n = bench_generation(args, path, 1, 1, window_s=COMMIT_WINDOW_S)
        ours[tgw] += rates
        early += n
    for config in configs:
        entry["llama_bench"][config] = {pp: mean_std(lb[config][pp]), tg: mean_std(lb[config][tg]),
                                        "runs": lb[config]["commands"]}
    entry["lmsp"][pp] = mean_std(ours[pp])
    entry["lmsp"][tg] = mean_std(ours[tg]) | {"stopped_early": early}
    entry["lmsp"][tgw] = mean_std(ours[tgw])
    for k in args.parallel:
        if k == 1:
            entry["lmsp"][f"{tg} x1"] = entry["lmsp"][tg]
            continue
        print(f"# lmsp {tg} x{k}", flush=True)
        rates, n = bench_generation(args, path, k, args.reps)
        entry["lmsp"][f"{tg} x{k}"] = mean_std(rates) | {"stopped_early": n}
    return entry


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.no_llama_bench and not os.access(args.llama_bench, os.X_OK):
        print(f"error: {args.llama_bench} not found; build it with bench/build_reference.sh "
              "or pass --no-llama-bench", file=sys.stderr)
        return 2
    from lmsp import _native, native

    native.set_logging(False)
    load = os.getloadavg()[0]
    if load > 0.5 * (os.cpu_count() or 1):
        print(f"# warning: load average {load:.2f} on {os.cpu_count()} cores: other work competes "
              "with the benchmark, figures will be low and noisy", flush=True)
    models = make_models(args)
    started = time.time()
    report: dict = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        **git_state(),
        "machine": machine(),
        "load_average_before": os.getloadavg(),
        "system_info": native.system_info(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                     if k not in ("model_file",)},
        "models": {},
    }
    pp, tg = f"pp{args.n_prompt}", f"tg{args.n_gen}"
    for name, path in models:
        print(f"# model {name}: {path}", flush=True)
        report["models"][name] = measure_model(args, path, pp, tg)

    report["load_average_after"] = os.getloadavg()
    # the weight types whose products of several rows csrc/tile_matmul.cpp's tiles
    # take (none with LMSP_TILE_MATMUL=0)
    report["tile_matmul"] = _native.tile_matmul_types()
    print_table(report, pp, tg, args.parallel)
    print(f"load average (1, 5, 15 min) before: {fmt_load(report['load_average_before'])}, "
          f"after: {fmt_load(report['load_average_after'])} on {os.cpu_count()} cores")
    out = result_path("native", [name for name, _ in models], started, args.results_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"# wrote {out}")
    return 0


def print_table(report: dict, pp: str, tg: str, parallel: list[int]) -> None:
    rows = [("model", "test", "llama-bench matched", "llama-bench default", "lmsp", "lmsp/matched",
             "lmsp/default")]
    for name, entry in report["models"].items():
        lb = entry["llama_bench"]
        for test in (pp, tg, f"{tg} windowed"):
            ours = entry["lmsp"].get(test)
            if ours is None:  # a report from before the windowed test
                continue
            cells = [name, test]
            ratios = []
            for config in ("matched", "default"):
                ref = lb.get(config, {}).get(test.split()[0])
                cells.append(fmt(ref))
                ratios.append(f"{paired_ratio(ours, ref):.3f}" if ref else "-")
            rows.append((*cells, fmt(ours), *ratios))
        base = entry["lmsp"][tg]["mean"]
        for k in parallel:
            agg = entry["lmsp"][f"{tg} x{k}"]
            note = f"{agg['mean'] / base:.2f}x of 1 seq"
            if agg["stopped_early"]:
                note += f", {agg['stopped_early']} stopped early"
            rows.append((name, f"{tg} x{k} (aggregate)", "", "", fmt(agg), note, ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print("\ntokens/s, mean ± standard deviation over the repetitions; ratios: the median over the "
          "repetitions of lmsp / llama-bench measured back to back; "
          f"{tg}: the consumer is woken for every token, {tg} windowed: as the service's commit thread, "
          f"for a first text or an end, otherwise every {COMMIT_WINDOW_S * 1000:.0f} ms")


if __name__ == "__main__":
    sys.exit(main())
