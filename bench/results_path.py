"""Where a benchmark's result goes, and what every result says of its run.

Every result is one JSON file in ``bench/results/``, named

    <UTC time as YYYYMMDDTHHMMSSZ>-<kind>-<model>.json

``kind`` is what ran: the script's name (``serve``, ``native``, ``soak``...),
with underscores and a qualifier where a run is a variant (``serve_chat``,
``soak_seed23``); lowercase letters, digits and underscores only, so that
the first hyphen after the time ends it. ``model`` is the model's name, the
names of several joined by ``+``, or ``none`` where the result names no
model (the store benchmarks run none). The time is the run's start.
"""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
NAME = re.compile(r"(?P<time>\d{8}T\d{6}Z)-(?P<kind>[a-z0-9_]+)-(?P<model>[a-z0-9._+-]+)\.json")
_KIND = re.compile(r"[a-z0-9_]+")


def model_part(model: str | Iterable[str] | None) -> str:
    """The file name's model part: a name, several joined by ``+``, or ``none``."""
    names = [model] if isinstance(model, str) else list(model or ())
    parts = [re.sub(r"[^a-z0-9._-]+", "-", n.lower().removesuffix(".gguf")).strip("-.") for n in names]
    return "+".join(p for p in parts if p) or "none"


def result_path(kind: str, model: str | Iterable[str] | None = None, when: float | None = None,
                folder: Path = RESULTS) -> Path:
    """``folder/<when as YYYYMMDDTHHMMSSZ>-<kind>-<model>.json`` (``when``: seconds since the
    epoch, now if None)."""
    if not _KIND.fullmatch(kind):
        raise ValueError(f"a result's kind is lowercase letters, digits and underscores: {kind!r}")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    return Path(folder) / f"{stamp}-{kind}-{model_part(model)}.json"


def utc(when: float | None = None) -> str:
    """``when`` (now if None) as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


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
    """The CPU (its model name), the logical CPUs, the memory, the system and Python."""
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


def write_result(kind: str, model: str | Iterable[str] | None, record: dict, *, started: float | None = None,
                 out: Path | None = None, folder: Path = RESULTS, source: dict | None = None) -> Path:
    """Write ``record`` after the run's kind, start time (``started``, now if None), commit
    (``source``: git_state() as the run started; read now if None) and machine, to ``out`` or
    to result_path(kind, model, started, folder). Returns the path."""
    path = Path(out) if out is not None else result_path(kind, model, started, folder)
    full = {"benchmark": kind, "time": utc(started), **(source or git_state()), "machine": machine(), **record}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(full, indent=1, default=str) + "\n")
    print(f"wrote {path}", flush=True)
    return path
