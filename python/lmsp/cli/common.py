"""What every ``lmsp`` command shares: the exit statuses, the expected failure, the
configuration and the store of the data directory, and printing an answer (one JSON
object, or text and tables for the terminal)."""

from __future__ import annotations

import json
import os
import sys
import time
import unicodedata

from lmsp import config as _config

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A clear, expected failure of an operator command."""


# ---------------------------------------------------------------------- helpers
def _load_config(args) -> _config.Config:
    overrides = {"data_dir": getattr(args, "data_dir", None)}
    for name in ("bind", "model", "workers", "log_level", "max_attempts", "box_id"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    if getattr(args, "peer", None):
        overrides["peers"] = ",".join(args.peer)
    for name, setting in (("rpc", "rpc_servers"), ("tensor_split", "tensor_split"), ("rpc_timeout", "rpc_timeout")):
        if getattr(args, "command", None) == "serve" and getattr(args, name, None) is not None:
            overrides[setting] = getattr(args, name)
    try:
        cfg = _config.load(**overrides)
    except (ValueError, OSError) as exc:
        raise CommandError(f"configuration: {exc}") from None
    if cfg.data_dir.exists() and not cfg.data_dir.is_dir():
        raise CommandError(f"the data directory {cfg.data_dir} is not a directory")
    return cfg


def _database(cfg):
    """The data directory's database, which the operator commands never create: one made
    anywhere else than where the service runs would take pairing codes it never sees."""
    if not cfg.db_path.is_file():
        raise CommandError(f"no database at {cfg.db_path}; start the service there first or run `lmsp prepare`")
    return cfg.db_path


def _open_store(cfg):
    from lmsp.runtime import open_store
    from lmsp.runtime.startup import ensure_dirs

    _database(cfg)
    ensure_dirs(cfg)
    return open_store(cfg)


def _model_path(cfg, path: str) -> str:
    """``path`` as given, or the file of that name inside the models directory
    when only that one exists."""
    if not os.path.isabs(path) and not os.path.exists(path) and (cfg.models_dir / path).exists():
        return str(cfg.models_dir / path)
    return path


def _print(args, obj: dict, text: str | None = None) -> None:
    if args.json:
        print(json.dumps(obj, ensure_ascii=False))
    else:
        print(text if text is not None else json.dumps(obj, indent=2, ensure_ascii=False))


def _when(ts) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _cell(value) -> str:
    """A value for the terminal: control characters (a stored name may hold some) shown as '?'."""
    if value is None:
        return "-"
    return "".join("?" if unicodedata.category(ch) == "Cc" else ch for ch in str(value))


def _table(rows: list[list], header: list[str]) -> str:
    cells = [header] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


class _Progress:
    """A progress bar on stderr for hashing a model file."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.label, self.enabled, self._last = label, enabled, -1

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        pct = 100 if total == 0 else int(done * 100 / total)
        if pct == self._last:
            return
        self._last = pct
        bar = "#" * (pct // 4)
        sys.stderr.write(f"\r{self.label} [{bar:<25}] {pct:3d}% {done / 1e6:,.1f}/{total / 1e6:,.1f} MB")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
