"""Catalog models into a data directory: ``lmsp models pull`` and ``lmsp serve --model NAME``.

A pull takes the model from the cache (fetching it first if need be,
``lmsp.models.catalog``), writes it as ``DATA_DIR/models/NAME.gguf`` and registers it
with the catalog name as its id. What it does is shown as a progress bar on a
terminal, or as one JSON line per finished stage.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TextIO

from lmsp.models import catalog
from lmsp.models.catalog import CatalogModel, Step

STAGE_WIDTH = 8
BAR_WIDTH = 24
REDRAW_SECONDS = 0.1


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f}"


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Reporter:
    """Shows the steps of a pull: a bar on ``stream`` (bytes, rate, time left) for the stages
    this process does, and/or one JSON line on ``out`` per finished stage."""

    def __init__(self, *, bar: bool, json_lines: bool, stream: TextIO | None = None, out: TextIO | None = None) -> None:
        self.bar, self.json_lines = bar, json_lines
        self.stream, self.out = stream or sys.stderr, out or sys.stdout
        self._key: tuple[str, str] | None = None
        self._started = self._drawn = 0.0

    def __call__(self, step: Step) -> None:
        now = time.monotonic()
        if (step.stage, step.item) != self._key:
            self._key, self._started, self._drawn = (step.stage, step.item), now, 0.0
            if self.bar and step.stage == "download":
                self.stream.write(f"{'download':<{STAGE_WIDTH}} {step.item} (pip)\n")
                self.stream.flush()
        if step.finished:
            self._finish(step, now - self._started)
        elif self.bar and step.stage != "download" and now - self._drawn >= REDRAW_SECONDS:
            self._drawn = now
            self._draw(step, now - self._started, end="")

    def _finish(self, step: Step, seconds: float) -> None:
        if self.bar and step.stage != "download":
            self._draw(step, seconds, end="\n" if step.ok else " (not the catalog's file: replaced)\n")
        if self.json_lines:
            line = {"stage": step.stage, "item": step.item, "bytes": step.total, "seconds": round(seconds, 3)}
            if step.stage == "check":
                line["ok"] = step.ok
            self.out.write(json.dumps(line) + "\n")
            self.out.flush()

    def _draw(self, step: Step, seconds: float, end: str) -> None:
        total = max(step.total, 1)
        fill = min(BAR_WIDTH, step.done * BAR_WIDTH // total)
        rate = step.done / seconds if seconds > 0 else 0.0
        if step.finished:
            tail = _clock(seconds)
        else:
            tail = f"{_clock((step.total - step.done) / rate) if rate > 0 else '-:--:--'} left"
        self.stream.write(
            f"\r{step.stage:<{STAGE_WIDTH}} {step.item} [{'#' * fill:<{BAR_WIDTH}}] "
            f"{step.done * 100 // total:3d}% {_mb(step.done)}/{_mb(step.total)} MB "
            f"{_mb(rate)} MB/s {tail}\x1b[K{end}"
        )
        self.stream.flush()


def interactive(json_lines: bool) -> bool:
    """Whether to draw bars (and let pip draw its own): a terminal, and no JSON asked for."""
    return not json_lines and sys.stderr.isatty()


def catalog_name(given: str) -> CatalogModel | None:
    """The catalog model ``given`` names, when it names no file."""
    if Path(given).expanduser().exists():
        return None
    return catalog.load_catalog().get(given)


def fetch(model: CatalogModel, models_dir: Path, reporter: Reporter) -> Path:
    """The model checked in ``models_dir`` (copied there from the cache if need be)."""
    return catalog.install(model, models_dir, progress=reporter, quiet=not reporter.bar)


def register(cfg, store, model: CatalogModel, path: Path, reporter: Reporter) -> dict:
    """The model registered under its catalog name; a registration of this very file is kept."""
    from lmsp.errors import NotFound
    from lmsp.runtime import ModelRegistry

    registry = ModelRegistry(cfg, store)
    try:
        row = store.get_model(model.name)
    except NotFound:
        row = None
    if (
        row is not None
        and row["digest"] == f"sha256:{model.sha256}"
        and registry.file_path(row).resolve() == path.resolve()
        and registry.state(row) == "available"
    ):
        return registry.object(model.name)

    def progress(done: int, total: int) -> None:
        reporter(Step("register", model.name, done, total))

    out = registry.register(path.name, model.name, progress)
    reporter(Step("register", model.name, model.size, model.size, finished=True))
    return out


def listing() -> tuple[list[dict], list[list]]:
    """The catalog as objects and as table rows (NAME, SIZE, LICENCE, ARCH, CACHED, DESCRIPTION)."""
    models = sorted(catalog.load_catalog().values(), key=lambda m: m.name)
    cached = catalog.cache_dir()
    data, rows = [], []
    for m in models:
        is_cached = (cached / m.file_name).is_file() and (cached / m.file_name).stat().st_size == m.size
        data.append({**m.summary(), "cached": is_cached})
        rows.append(
            [m.name, f"{m.size / 1e6:.0f} MB", m.license, m.architecture, "yes" if is_cached else "no", m.description]
        )
    return data, rows
