"""Connections that wait for a request, bounded per client address and in total.

A connection is *idle* while the worker waits for its next request line and
headers: a new connection until its first request head is complete, a kept-
alive one between two requests. Idle connections cost a greenlet and a socket
each, and gunicorn's gevent worker accepts no more connections once
``worker_connections`` of them are open, so a client that opens connections
and sends nothing could take the worker from everyone. Here every idle wait
is registered; when one more would pass ``per_address`` idle connections of
its client address, or ``total`` in all, the oldest idle connection (of that
address first) is closed. A closed wait ends as a time-out does: the worker
closes the connection without an answer.

gevent only (the worker that uses it runs under gevent).
"""

from __future__ import annotations

import logging
import time

import gevent

log = logging.getLogger("lmsp.server")

WARN_EVERY = 60.0  # seconds between two log lines about idle connections closed early


class _Wait:
    """One idle wait: its time-out, thrown early into its greenlet to close it."""

    __slots__ = ("address", "glet", "timeout", "owner", "active")

    def __init__(self, owner: "IdleConnections", address: str, seconds: float) -> None:
        self.owner = owner
        self.address = address
        self.glet = gevent.getcurrent()
        # False: the wait ends silently (gevent takes it; its stubs leave it out)
        self.timeout = gevent.Timeout(seconds, False)  # type: ignore[arg-type]
        self.active = False

    def __enter__(self) -> "_Wait":
        self.timeout.start()
        self.active = True
        self.owner._enter(self)
        return self

    def __exit__(self, kind, value, tb) -> bool:
        self.active = False
        self.owner._forget(self)
        self.timeout.close()
        return value is self.timeout  # the time-out (or an early close) ends the wait quietly

    def close(self) -> None:
        """End the wait as its time-out would (from another greenlet)."""
        gevent.get_hub().loop.run_callback(self._fire)

    def _fire(self) -> None:
        if self.active and not self.glet.dead:
            self.glet.throw(self.timeout)


class IdleConnections:
    """The idle waits of one worker process, oldest first."""

    def __init__(self, total: int, per_address: int, clock=time.monotonic) -> None:
        self.total = max(1, int(total))
        self.per_address = max(1, int(per_address))
        self._all: dict[_Wait, None] = {}
        self._by_address: dict[str, dict[_Wait, None]] = {}
        self.closed_early = 0  # idle connections closed to make room, since the start
        self._clock = clock
        self._unreported = 0
        self._reported_at = 0.0

    def __len__(self) -> int:
        return len(self._all)

    def waiting(self, address: str, seconds: float) -> _Wait:
        """A context manager around one wait for a request head from ``address``, ended
        after ``seconds`` (quietly: the code after it sees no request)."""
        return _Wait(self, address, seconds)

    def close_all(self) -> int:
        """Close every idle connection now (the worker is stopping); how many."""
        waits = list(self._all)
        for wait in waits:
            self._forget(wait)
            wait.close()
        return len(waits)

    def _enter(self, wait: _Wait) -> None:
        same = self._by_address.get(wait.address)
        while same and len(same) >= self.per_address:
            self._evict(next(iter(same)))
        while len(self._all) >= self.total:
            self._evict(next(iter(self._all)))
        self._all[wait] = None
        self._by_address.setdefault(wait.address, {})[wait] = None

    def _forget(self, wait: _Wait) -> None:
        if wait not in self._all:  # closed early, or never entered
            return
        del self._all[wait]
        group = self._by_address[wait.address]
        del group[wait]
        if not group:
            del self._by_address[wait.address]

    def _evict(self, wait: _Wait) -> None:
        self._forget(wait)
        wait.close()
        self.closed_early += 1
        self._unreported += 1
        now = self._clock()
        if now - self._reported_at >= WARN_EVERY:
            log.warning(
                "closed %d idle connection(s) to stay within %d per address and %d in all (the oldest first)",
                self._unreported,
                self.per_address,
                self.total,
            )
            self._unreported, self._reported_at = 0, now
