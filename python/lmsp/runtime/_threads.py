"""Real OS threads and cross-thread wake-ups, with or without gevent.

Under gunicorn's gevent worker the ``threading`` module is monkey-patched:
``threading.Thread`` starts a greenlet and ``threading.Lock`` is a gevent lock.
The runtime's loops must run on real OS threads (the engine and SQLite block),
so this module takes the original primitives from ``gevent.monkey`` when gevent
patched them, and the standard ones otherwise.

Wake-ups *into* a real thread go through a pipe (a greenlet writes one byte,
which never blocks the hub). Wake-ups *out of* a real thread into greenlets go
through the hub's async watcher (see :mod:`lmsp.runtime.waiters`).
"""

from __future__ import annotations

import errno
import importlib
import logging
import math
import os

from lmsp.serving.hubsafe import gevent_active

log = logging.getLogger("lmsp.runtime")

# gevent_active is handed on to the runtime's modules from here, with the rest of
# what they need to know about threads
__all__ = ["RealThread", "Wakeup", "allocate_lock", "gevent_active", "original", "thread_names"]


def original(module: str, name: str):
    """The unpatched ``module.name`` (gevent keeps the originals it replaced)."""
    try:
        from gevent import monkey
    except ImportError:  # pragma: no cover - gevent is a dependency
        return getattr(importlib.import_module(module), name)
    return monkey.get_original(module, name)


allocate_lock = original("_thread", "allocate_lock")
_start_new_thread = original("_thread", "start_new_thread")
_poll = original("select", "poll")
_POLLIN = 0x001


_names: dict[int, str] = {}  # ident -> name of the live RealThreads (for stack dumps)
_get_ident = original("_thread", "get_ident")


def thread_names() -> dict[int, str]:
    """The names of this module's live threads by ident (``threading`` does not list them)."""
    return dict(_names)


class RealThread:
    """A daemon OS thread running ``target()``; ``join`` waits on an OS lock."""

    def __init__(self, target, name: str) -> None:
        self.name = name
        self._target = target
        self._done = allocate_lock()
        self._started = False

    def start(self) -> None:
        self._done.acquire()
        self._started = True
        _start_new_thread(self._run, ())

    def _run(self) -> None:
        ident = _get_ident()
        _names[ident] = self.name
        try:
            self._target()
        except BaseException:  # the loops catch their own errors; this is the last resort
            log.exception("thread %s died", self.name)
        finally:
            _names.pop(ident, None)
            self._done.release()

    def join(self, timeout: float | None = None) -> bool:
        """True once the thread has ended (False on timeout)."""
        if not self._started:
            return True
        got = self._done.acquire(True, -1 if timeout is None else max(0.0, timeout))
        if got:
            self._done.release()
        return got

    @property
    def alive(self) -> bool:
        if not self._started:
            return False
        if self._done.acquire(False):
            self._done.release()
            return False
        return True


class Wakeup:
    """A level-triggered wake-up flag for a real thread, settable from anywhere.

    ``set()`` writes one byte to a non-blocking pipe (safe from greenlets,
    threads and signal handlers); ``wait()`` sleeps in the original ``poll``
    on that pipe plus any extra file descriptors, so one call can wait for
    both "someone asked" and "the engine has results".
    """

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._closed = False

    def set(self) -> None:
        if self._closed:
            return
        try:
            os.write(self._w, b"\x01")
        except BlockingIOError:
            pass  # already full: a wake-up is pending anyway
        except OSError as exc:  # closed under us at shutdown
            if exc.errno != errno.EBADF:
                raise

    def wait(self, timeout: float | None, fds: tuple[int, ...] | list[int] = ()) -> bool:
        """Sleep until set, an fd is readable, or timeout; True if set was called."""
        poller = _poll()
        poller.register(self._r, _POLLIN)
        for fd in fds:
            poller.register(fd, _POLLIN)
        # poll counts whole milliseconds: round up, or the last fraction of a
        # millisecond before a deadline would be spent calling poll(0) in a loop
        ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
        try:
            ready = poller.poll(ms)
        except InterruptedError:
            ready = []
        woken = any(fd == self._r for fd, _ in ready)
        if woken:
            self.clear()
        return woken

    def clear(self) -> None:
        try:
            while os.read(self._r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._r)
            os.close(self._w)
