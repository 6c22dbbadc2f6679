"""A task's committed event log as a stream (LMSP B.6), written by a
:class:`Framing`.

A stream reads committed events from the store after the last sequence number
it sent, writes them, and waits for the next commit through
``runtime.wait_for_commit`` (which never blocks the gevent hub and holds no
store connection). It ends after the terminal event. Events that this worker's
latest commit wrote come from ``runtime.committed_events`` instead of a read,
once the store has answered for the task.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Protocol

from lmsp.contracts import RuntimeAPI
from lmsp.errors import LMSPError, Unauthorized, Unavailable
from lmsp.store.states import FINISHED

if TYPE_CHECKING:
    from lmsp.store import Store

log = logging.getLogger("lmsp.service")

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed", "response.cancelled"})
TASK_EVENT_PREFIX = "task."  # the task lifecycle events, which response streams leave out
# a comment line alone, with no blank line after it: a decoder that keeps the last event id
# (the openai package) dispatches an empty event at every blank line once it has seen one
PAGE = 500
POLL_SECONDS = 0.25  # how often a stream polls the store when the runtime does not watch it
AUTH_RECHECK_SECONDS = 5.0  # how often an open stream asks whether its reader's client was revoked
BUSY_GIVE_UP_SECONDS = 10.0  # a stream whose store stays unavailable this long ends with an error event


class Framing(Protocol):
    """How a stream writes its task's events (an event that gives no bytes is not
    written), the error that ends it, the ``server_stopping`` error that ends it when
    the worker stops (after the event ``last``), and the bytes that keep an idle
    connection open."""

    keep_alive: bytes

    def event(self, event: dict[str, Any]) -> bytes: ...

    def error(self, code: str, message: str, param: str | None = None, sequence_number: int = 0) -> bytes: ...

    def stopping(self, last: int) -> bytes: ...


def event_stream(
    store: Store,
    runtime: RuntimeAPI,
    task_id: str,
    *,
    after: int = 0,
    client_id: str | None = None,
    heartbeat: float = 15.0,
    on_abandon: Callable[[], None] | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    poll: float = POLL_SECONDS,
    authorized: Callable[[], bool] | None = None,
    task_events: bool = True,
    framing: Framing,
) -> Iterator[bytes]:
    """SSE frames of ``task_id``'s events after ``after``, then live ones, written by
    ``framing``.

    ``task_events``: False for a response stream, which carries the response's
    events only (B.6): the ``task.*`` events stay in the task's log, and the
    numbers of the events sent are those of the log.

    ``on_abandon`` runs when the consumer closes the stream before its end
    (the client went away). ``authorized`` is asked every
    :data:`AUTH_RECHECK_SECONDS` while the stream is open: once it says no
    (the reader's client was revoked), the stream ends with an
    ``unauthorized`` error event, and the task runs on.
    """
    stream = _Stream(
        store,
        runtime,
        task_id,
        after=after,
        client_id=client_id,
        monotonic=monotonic,
        poll=poll,
        authorized=authorized,
        framing=framing,
    )
    stream.task_events = task_events
    try:
        yield from stream.frames(heartbeat)
    except LMSPError as exc:
        stream.finished = True
        yield framing.error(exc.code, exc.message, exc.param, sequence_number=stream.last)
    except Exception:  # noqa: BLE001 - a stream must end with a frame, never a traceback
        stream.finished = True
        log.exception("event stream of %s failed", task_id)
        yield framing.error("internal_error", "the event stream failed", sequence_number=stream.last)
    finally:
        if not stream.finished and on_abandon is not None:
            try:
                on_abandon()
            except Exception:  # noqa: BLE001
                log.exception("cleanup of the abandoned stream of %s failed", task_id)


class _Stream:
    """One stream's reads and waits, and where it stands between them."""

    def __init__(
        self,
        store: Store,
        runtime: RuntimeAPI,
        task_id: str,
        *,
        after: int,
        client_id: str | None,
        monotonic: Callable[[], float],
        poll: float,
        authorized: Callable[[], bool] | None,
        framing: Framing,
    ) -> None:
        self.store = store
        self.runtime = runtime
        self.task_id = task_id
        self.client_id = client_id
        self.monotonic = monotonic
        self.poll = poll
        self.authorized = authorized
        self.last = after  # the last sequence number sent
        self.wake_at = after  # the sequence number whose successor's commit wakes the stream
        self.checked = False  # the store has answered once: the task exists and the client may read it
        self.since = runtime.commit_generation()  # the runtime's commit generation before the last read
        self.finished = False  # ended on purpose (not abandoned by its reader)
        self.task_events = True  # False: the task.* events are not sent
        self.framing = framing
        self.busy_since: float | None = None
        self.last_write = self.last_auth = monotonic()

    def frames(self, heartbeat: float) -> Iterator[bytes]:
        while True:
            self.check_authorized()
            page = self.read()
            if page is None:
                continue
            for event in page["data"]:
                self.last = self.wake_at = event["sequence_number"]
                out = self.framing.event(event)
                if event["type"] in TERMINAL_EVENTS:
                    self.finished = True
                    yield out
                    return
                if not self.task_events and event["type"].startswith(TASK_EVENT_PREFIX):
                    continue
                if out:
                    yield out
                    self.last_write = self.monotonic()
            if page["has_more"]:
                continue
            if not page["data"]:
                state = self.task_state()
                if state == "busy":
                    continue
                if state == "done":
                    self.finished = True
                    return
            if self.runtime.streams_ending:
                self.finished = True  # not abandoned: the task runs on, or follows its restart policy
                yield self.framing.stopping(self.last)
                return
            idle = self.monotonic() - self.last_write
            if idle >= heartbeat:
                yield self.framing.keep_alive
                self.last_write = self.monotonic()
                continue
            self.wait(heartbeat, idle)

    def check_authorized(self) -> None:
        """Raise Unauthorized once the reader's client is revoked (asked every AUTH_RECHECK_SECONDS)."""
        if self.authorized is None or self.monotonic() - self.last_auth < AUTH_RECHECK_SECONDS:
            return
        self.last_auth = self.monotonic()
        try:
            allowed = self.authorized()
        except Unavailable:  # a busy store: ask again at the next check
            allowed = True
        if not allowed:
            raise Unauthorized("the client of this stream was revoked")

    def read(self) -> dict[str, Any] | None:
        """The next page of events after ``last``; None when the store was busy (after a pause)."""
        try:
            self.since = self.runtime.commit_generation()
            fresh = self.runtime.committed_events(self.task_id, self.last) if self.checked else None
            if fresh:
                page: dict[str, Any] = {"data": fresh, "has_more": False}
            else:
                page = self.store.events(self.task_id, after=self.last, limit=PAGE, client_id=self.client_id)
                self.checked = True
        except Unavailable as exc:
            self.busy_since = _busy(exc, self.busy_since, self.monotonic, self.poll)
            return None
        self.busy_since = None
        return page

    def task_state(self) -> Literal["busy", "done", "running"]:
        """After a page with no event: "done" when the task has finished and every event
        was sent, "busy" when the store was (after a pause), else "running"."""
        try:
            task = self.store.get_task(self.task_id, self.client_id)
        except Unavailable as exc:
            self.busy_since = _busy(exc, self.busy_since, self.monotonic, self.poll)
            return "busy"
        counter = task.get("last_sequence_number", self.last)
        if task["status"] in FINISHED and counter <= self.last:
            return "done"
        # a stream that starts past the task's last event waits for the task's next
        # one (its end included), not for one past its own start
        self.wake_at = min(self.last, counter)
        return "running"

    def wait(self, heartbeat: float, idle: float) -> None:
        """Until the task's next commit, or the next heartbeat: a runtime that watches the
        store wakes the stream when its task moves; otherwise the stream polls."""
        if self.runtime.watches_store:
            wait = heartbeat - idle
        else:
            wait = min(self.poll, heartbeat - idle)
        self.runtime.wait_for_commit(self.task_id, self.wake_at, max(0.001, wait), since=self.since)


def _busy(exc: Unavailable, since: float | None, monotonic: Callable[[], float], poll: float) -> float:
    """A store busy for a moment: wait ``poll`` and let the stream read again; give up
    (raise ``exc``) once it has been busy for BUSY_GIVE_UP_SECONDS. Returns when the busy
    spell began. A plain sleep (a greenlet's under gevent): asking the runtime to
    wait would read the busy store once more."""
    now = monotonic()
    since = now if since is None else since
    if now - since > BUSY_GIVE_UP_SECONDS:
        raise exc
    time.sleep(poll)
    return since
