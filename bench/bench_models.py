"""The models the benchmarks run, by name or file.

A name is a model of the catalog (``lmsp models pull --list``), fetched and
checked into the user's cache through ``lmsp.models.catalog``, or a demo preset
(``lmsp.models.demo``: ``tiny``, ``bench``...), written into the benchmark's
work folder. The catalog models are the default: real weights, real
tokenizers, real quantizations. The demo ``tiny`` model is a micro-benchmark
of what the service spends per request and per token around a model that
costs almost nothing to run; its figures are reported on their own.
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODELS = "smollm2-135m-instruct,gemma-3-270m"


@dataclass(frozen=True)
class BenchModel:
    name: str
    path: Path
    kind: str   # "catalog", "demo" or "file"


def _demo(name: str, folder: Path, remake: bool) -> Path:
    path = folder / f"{name}.gguf"
    if remake or not path.is_file():
        print(f"making the {name} demo model -> {path}", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "lmsp.models.demo", str(path), "--preset", name], check=True)
    return path


def resolve(names: list[str], files: list[str | Path], demo_dir: Path, remake: bool = False) -> list[BenchModel]:
    """Every model asked for, each a file that exists; exits with a message otherwise."""
    from lmsp.models import catalog
    from lmsp.models.demo import PRESETS

    known = catalog.load_catalog()
    out = []
    for name in names:
        if name in known:
            try:
                path = catalog.ensure_model(name)
            except catalog.CatalogError as exc:
                raise SystemExit(f"model {name}: {exc}") from None
            out.append(BenchModel(name, Path(path), "catalog"))
        elif name in PRESETS:
            out.append(BenchModel(name, _demo(name, demo_dir, remake), "demo"))
        else:
            raise SystemExit(f"unknown model {name!r}: neither in the catalog ({', '.join(known)}) "
                             f"nor a demo preset ({', '.join(PRESETS)})")
    for given in files:
        path = Path(given).resolve()
        if not path.is_file():
            raise SystemExit(f"model file {path} does not exist")
        out.append(BenchModel(path.stem, path, "file"))
    return out


def has_chat_template(path: Path) -> bool:
    from lmsp import native

    return bool(native.read_gguf_info(str(path)).get("chat_template"))
