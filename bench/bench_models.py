"""The models the benchmarks run, by name or file.

A name is a model of the catalog (``lmsp models pull --list``), fetched and
checked into the user's cache through ``lmsp.models.catalog``, or a demo shape of
DEMO_SHAPES (random weights, written by ``lmsp.models.demo`` into the
benchmark's work folder):

    tiny    the service's demo model (lmsp.models.demo's defaults), 17 MB f32
    small   256 wide, 4 layers, f16: rows of whole K-quant blocks
    bench   310M parameters in q8_0 (329 MB): decoding bound by memory bandwidth
    large   1.26B parameters in q8_0 (1.34 GB): a GPU's decoding bound by memory bandwidth

    python bench/bench_models.py NAME OUT.gguf     # write one demo shape

The catalog models are the default: real weights, real tokenizers, real
quantizations. The demo ``tiny`` model is a micro-benchmark
of what the service spends per request and per token around a model that
costs almost nothing to run; its figures are reported on their own.
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODELS = "smollm2-135m-instruct,gemma-3-270m"
# fields of lmsp.models.demo.DemoModelSpec (its defaults where not given)
DEMO_SHAPES: dict[str, dict] = {
    "tiny": {},
    "small": dict(n_embd=256, n_layer=4, n_head=8, n_head_kv=4, n_ff=768, dtype="f16", name="lmsp-demo-small"),
    "bench": dict(n_embd=1024, n_layer=16, n_head=16, n_head_kv=4, n_ff=4096, dtype="q8_0", name="lmsp-demo-bench"),
    "large": dict(n_embd=2048, n_layer=24, n_head=16, n_head_kv=8, n_ff=5632, dtype="q8_0", name="lmsp-demo-large"),
}


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
        # in a process of its own: the benchmark's own memory stays as it was
        subprocess.run([sys.executable, __file__, name, str(path)], check=True)
    return path


def write_demo(name: str, path: Path) -> Path:
    """The demo shape ``name`` written to ``path``."""
    from lmsp.models.demo import write_demo_model

    return write_demo_model(path, **DEMO_SHAPES[name])


def resolve(names: list[str], files: list[str | Path], demo_dir: Path, remake: bool = False) -> list[BenchModel]:
    """Every model asked for, each a file that exists; exits with a message otherwise."""
    from lmsp.models import catalog

    known = catalog.load_catalog()
    out = []
    for name in names:
        if name in known:
            try:
                path = catalog.ensure_model(name)
            except catalog.CatalogError as exc:
                raise SystemExit(f"model {name}: {exc}") from None
            out.append(BenchModel(name, Path(path), "catalog"))
        elif name in DEMO_SHAPES:
            out.append(BenchModel(name, _demo(name, demo_dir, remake), "demo"))
        else:
            raise SystemExit(f"unknown model {name!r}: neither in the catalog ({', '.join(known)}) "
                             f"nor a demo shape ({', '.join(DEMO_SHAPES)})")
    for given in files:
        path = Path(given).resolve()
        if not path.is_file():
            raise SystemExit(f"model file {path} does not exist")
        out.append(BenchModel(path.stem, path, "file"))
    return out


def has_chat_template(path: Path) -> bool:
    from lmsp import native

    return bool(native.read_gguf_info(str(path)).get("chat_template"))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in DEMO_SHAPES:
        raise SystemExit(f"usage: bench/bench_models.py {{{','.join(DEMO_SHAPES)}}} OUT.gguf")
    print(write_demo(sys.argv[1], Path(sys.argv[2])))
