"""Telling whether a model file changed since it was loaded, cheaply.

A file's :class:`FileIdentity` (device, inode, size, modification and change
times) is read with one ``stat``. Any write, truncation, ``chmod`` or ``touch``
moves the change time (which no program can set back), and a file replaced by
a rename or a copy is another inode or another size: a file whose identity is
unchanged has not been written since (within the file system's clock tick).

:class:`FileWatch` asks Linux's inotify (through ctypes, no dependency) to make
one descriptor readable when a watched file is written, truncated, has its
metadata changed, or is renamed or deleted, so that a thread sleeping on it
checks at once; where inotify is missing it has no descriptor and the caller
polls the identities instead.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass

log = logging.getLogger("lmsp.runtime")

# <sys/inotify.h>
_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x002, 0x004, 0x008
_IN_MOVE_SELF, _IN_DELETE_SELF = 0x800, 0x400
_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVE_SELF | _IN_DELETE_SELF
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC


@dataclass(frozen=True)
class FileIdentity:
    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: str | os.PathLike) -> "FileIdentity | None":
        """The identity of the file at ``path`` now (None: no such file, or unreadable)."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def same_bytes_as(self, other: "FileIdentity | None") -> bool:
        """The same file, of the same size, last written at the same time: only its
        change time moved, as a new hard link, a chmod or a chown moves it. (A write
        that set its modification time back is caught by a hash: ``changed_files``.)"""
        return other is not None and (self.dev, self.ino, self.size, self.mtime_ns) == (
            other.dev,
            other.ino,
            other.size,
            other.mtime_ns,
        )


def _libc():
    # the C library the interpreter already uses (ctypes.util.find_library would run
    # ldconfig in a subprocess, which gevent's patched subprocess refuses off its hub)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):  # not Linux, or a C library without inotify
        return None


class FileWatch:
    """Watches files by key; :meth:`fileno` is readable once one may have changed
    (None where inotify is not available: poll). Not thread-safe: one owner."""

    def __init__(self) -> None:
        self._libc = _libc()
        self._fd = -1
        self._wds: dict[str, int] = {}  # key -> watch descriptor
        if self._libc is None:
            log.info("no inotify: model files are checked by polling only")
            return
        fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd >= 0:
            self._fd = fd
        else:  # out of inotify instances (fs.inotify.max_user_instances), say
            log.info("no inotify (%s): model files are checked by polling only", os.strerror(ctypes.get_errno()))

    def fileno(self) -> int | None:
        return self._fd if self._fd >= 0 else None

    def add(self, key: str, path: str | os.PathLike) -> None:
        """Watch the file ``path`` names now (the same inode after a rename)."""
        if self._fd < 0:
            return
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), _MASK)
        if wd < 0:  # out of watches (fs.inotify.max_user_watches): polling still sees it
            log.info("cannot watch %s: %s", path, os.strerror(ctypes.get_errno()))
            return
        self._wds[key] = wd

    def remove(self, key: str) -> None:
        wd = self._wds.pop(key, None)
        if wd is None or self._fd < 0 or wd in self._wds.values():
            return  # (two keys on one file share its watch)
        self._libc.inotify_rm_watch(self._fd, wd)  # fails harmlessly for a file gone

    def drain(self) -> bool:
        """Read the pending events; True when there were any."""
        if self._fd < 0:
            return False
        seen = False
        try:
            while os.read(self._fd, 65536):
                seen = True
        except (BlockingIOError, OSError):
            pass
        return seen

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._wds.clear()
