"""The record bench/serve.py keeps of a run: one JSON file per model under bench/results.

Each file says what produced the figures (the commit, whether the tree had
uncommitted changes, the command, the machine) and holds the figures: the
median round of every level, the ratios to llama-server, the goal checks and
tok/s over all rounds.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = ROOT / "bench" / "results"


def git_state(root: Path = ROOT) -> dict:
    """The checked-out commit and whether tracked files differ from it."""
    def git(*argv: str) -> str:
        try:
            out = subprocess.run(["git", "-C", str(root), *argv], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def machine() -> dict:
    info: dict = {"nproc": os.cpu_count(), "cpu": platform.processor() or None,
                  "system": f"{platform.system()} {platform.release()}", "python": platform.python_version()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        info["memory_mib"] = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return info


def write_model_results(folder: Path, model: str, payload: dict, when: float | None = None,
                        source: dict | None = None) -> Path:
    """``folder/serve-MODEL-YYYYMMDD-HHMM.json`` (UTC), with the run's provenance first:
    ``source`` is git_state() as the run started (read now if not given)."""
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime(when))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"serve-{model}-{stamp}.json"
    record = {"benchmark": "serve", "model": model,
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)),
              **(source or git_state()), "machine": machine(), **payload}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def write_history(benchmark: str, started: str, record: dict, out: Path | None = None) -> Path:
    """``bench/results/history/<started as YYYY-MM-DDTHHMM>-<benchmark>.json`` (or ``out``):
    ``record`` after the benchmark's name, its start (``%Y-%m-%dT%H:%M:%SZ``) and
    git_state(); a script that runs one benchmark writes its run with this."""
    stamp = started[:13].replace(":", "") + started[14:16]  # 2026-12-01T2214
    path = out or ROOT / "bench" / "results" / "history" / f"{stamp}-{benchmark}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    full = {"benchmark": benchmark, "time": started, **git_state(), **record}
    path.write_text(json.dumps(full, indent=1, default=str) + "\n")
    print(f"wrote {path}", flush=True)
    return path


PAIRED_FIELDS = {"tok_s": "tok_s", "ttft_p50": "ttft_p50_ms", "cpu_per_token": "cpu_ms_per_token"}


def paired_ratios(levels: list) -> dict[tuple, dict]:
    """Per (model, server, clients), each figure of PAIRED_FIELDS as the median over the
    rounds of the server's round over llama-server's round of the same number: the two
    ran back to back, so a change in the machine's load between rounds cancels out.
    ``levels`` are every round's LevelResult."""
    llama = {(x.model, x.clients, x.round): x for x in levels if x.server == "llama"}
    ratios: dict[tuple, dict[str, list[float]]] = {}
    for x in levels:
        base = llama.get((x.model, x.clients, x.round))
        if x.server == "llama" or base is None:
            continue
        got = ratios.setdefault((x.model, x.server, x.clients), {k: [] for k in PAIRED_FIELDS})
        for key, attr in PAIRED_FIELDS.items():
            a, b = getattr(x, attr), getattr(base, attr)
            if a is not None and b:
                got[key].append(a / b)
    return {k: {"rounds": max(len(v) for v in d.values()),
                **{f: (statistics.median(v) if v else None) for f, v in d.items()}}
            for k, d in ratios.items()}


def paired_table(paired: dict[tuple, dict]) -> str:
    lines = ["| model | server | clients | rounds | tok/s | TTFT p50 | CPU/tok |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    show = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for (model, server, clients), x in sorted(paired.items()):
        lines.append(f"| {model} | {server} | {clients} | {x['rounds']} | {show(x['tok_s'])} "
                     f"| {show(x['ttft_p50'])} | {show(x['cpu_per_token'])} |")
    return "\n".join(lines)
