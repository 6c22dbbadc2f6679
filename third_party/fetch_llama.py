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
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
PIN_FILE = HERE / "llama.cpp.toml"
STAMP = ".lmsp-pin"

# Parts of the release that no build here uses.
SKIP_DIRS = {".github", ".devops", "docs", "media", "gguf-py"}
# The one vocabulary the demo model borrows.
KEEP_MODELS = {"ggml-vocab-llama-spm.gguf"}


def load_pin() -> dict:
    with PIN_FILE.open("rb") as fh:
        return tomllib.load(fh)["llama_cpp"]


def default_cache() -> Path:
    if os.environ.get("LMSP_CACHE_DIR"):
        return Path(os.environ["LMSP_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lmsp"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_archive(pin: dict, cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / pin["archive"]
    if archive.exists():
        if sha256_of(archive) == pin["sha256"]:
            return archive
        print(f"fetch_llama: cached {archive} fails its sha256; fetching again", file=sys.stderr)
        archive.unlink()
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", "--disable-pip-version-check", "--quiet",
               "-d", tmp, f"{pin['package']}=={pin['version']}"]
        print("fetch_llama:", " ".join(cmd[2:]), file=sys.stderr)
        subprocess.run(cmd, check=True)
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
