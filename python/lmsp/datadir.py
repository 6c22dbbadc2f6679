"""The data directory's lock: one service at a time on a data directory.

Light on purpose: the gunicorn master takes it before anything else, and
imports nothing of the service (no gevent, no SQLite, no engine).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path


def private_umask() -> int:
    """Files and directories made from now on are the service user's alone (the
    database holds every client's prompts and answers, the data directory the
    admin token); returns the mask before."""
    before = os.umask(0o077)
    os.umask(before | 0o077)
    return before


class DataDirInUse(RuntimeError):
    """Another service's processes hold the data directory."""


LOCK_NAME = "lmsp.lock"
LOCK_FD_ENV = "LMSP_DATA_LOCK_FD"  # the master's descriptor of the lock, handed to its preparation


def hold_data_dir(data_dir, *, wait: float = 0.0) -> int:
    """Take the data directory for this service: an exclusive ``flock`` on
    ``DATA_DIR/lmsp.lock``, held for as long as the returned descriptor is open
    here or in a child (gunicorn's workers inherit the master's). Start-up
    recovery treats every unfinished task as left over from a stopped
    service: with another service's processes still running on the directory
    (a second ``lmsp serve``, a manual ``lmsp prepare``) it would fail their
    tasks. ``wait``: seconds to keep trying (the processes of a service that was
    just killed may take a moment to go). A descriptor named by
    ``LMSP_DATA_LOCK_FD`` is the caller's parent's lock on the same file: taking
    it again through that descriptor succeeds.
    """
    path = Path(data_dir) / LOCK_NAME
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    inherited = os.environ.get(LOCK_FD_ENV)
    if inherited and inherited.isdigit():
        fd = int(inherited)
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
        except OSError:
            pass  # not (or no longer) the lock: take it anew
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise DataDirInUse(
                    f"another lmsp service uses the data directory {data_dir} (it holds {path}); stop it first"
                ) from None
            time.sleep(0.1)
