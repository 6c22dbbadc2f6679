"""A gevent worker's graceful stop, from its SIGTERM to its runtime's stop.

At the SIGTERM the worker's runtimes drain (they claim nothing more, and the
API answers a request that would create a task with 503 ``unavailable``, on
every connection still open); gunicorn stops accepting connections. Then
:class:`WindDown`, in a greenlet of its own:

1. waits while the runtimes still run claimed tasks, for ``stop_grace_seconds``
   at most, and never past gunicorn's graceful timeout less
   :data:`STOP_RESERVE_SECONDS`: a task that ends meanwhile is answered and
   streamed to its end as usual;
2. ends every open event stream with an ``error`` event of code
   ``server_stopping`` (and every request still waiting for a task with 503),
   so that no client is left with a connection cut short;
3. closes the connections that wait for a request.

gunicorn's ``worker_exit`` hook then waits for it (:meth:`WindDown.wait`)
and stops the runtimes in the time left; tasks still running keep their state
and follow their restart policy at the next start.
"""

from __future__ import annotations

import logging
import time

import gevent

log = logging.getLogger("lmsp.server")

POLL_SECONDS = 0.1
# of gunicorn's graceful timeout: kept for ending the streams and stopping the runtime
STOP_RESERVE_SECONDS = 5.0


class WindDown:
    """Started at the worker's SIGTERM; see the module docstring."""

    def __init__(self, runtimes, idle, grace: float, graceful_timeout: float, clock=time.monotonic) -> None:
        self._runtimes = list(runtimes)
        self._idle = idle
        self._clock = clock
        self.started = clock()
        self.grace = max(0.0, min(float(grace), graceful_timeout - STOP_RESERVE_SECONDS))
        self.deadline = self.started + graceful_timeout  # when gunicorn's master kills the worker
        self._greenlet = gevent.spawn(self._run)

    def _busy(self) -> int:
        return sum(runtime.busy() for runtime in self._runtimes)

    def _run(self) -> None:
        until = self.started + self.grace
        busy = self._busy()
        if busy:
            log.info("stopping: waiting up to %.1f s for %d running task(s)", self.grace, busy)
        while busy and self._clock() < until:
            gevent.sleep(POLL_SECONDS)
            busy = self._busy()
        if busy:
            log.info("stopping: %d task(s) still running; they follow their restart policy at the next start", busy)
        for runtime in self._runtimes:
            runtime.end_streams()
        closed = self._idle.close_all()
        log.info("stopping: open streams ended, %d idle connection(s) closed", closed)

    def wait(self) -> None:
        """Until the wind-down is done (at most its grace period and a second)."""
        left = self.started + self.grace + 1.0 - self._clock()
        self._greenlet.join(timeout=max(0.0, left))

    def time_left(self) -> float:
        """Seconds until gunicorn's master kills the worker."""
        return self.deadline - self._clock()
