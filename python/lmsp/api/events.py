"""Server-sent events of a task's committed event log (LMSP B.6).

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
from typing import Callable, Iterator

import falcon

from lmsp.errors import LMSPError, Unauthorized, Unavailable

from .common import SSE_TYPE, dumps
from .middleware import error_frame

log = logging.getLogger("lmsp.api")

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed",
                             "response.cancelled"})
FINISHED_TASK_STATES = frozenset({"completed", "failed", "cancelled"})
KEEP_ALIVE = b": keep-alive\n\n"
PAGE = 500
POLL_SECONDS = 0.25  # how often a stream polls the store when the runtime does not watch it
AUTH_RECHECK_SECONDS = 5.0  # how often an open stream asks whether its reader's client was revoked
BUSY_GIVE_UP_SECONDS = 10.0  # a stream whose store stays unavailable this long ends with an error event


def frame(event: dict) -> bytes:
    """One event in SSE framing: ``id``, ``event``, ``data``, blank line."""
    return (f"id: {event['sequence_number']}\nevent: {event['type']}\n"
            f"data: {dumps(event)}\n\n").encode("utf-8")


def stopping_frame(last: int) -> bytes:
    """The ``error`` event that ends a stream when the worker stops (not a response event:
    the task goes on after the restart, from the event after ``last``)."""
    return error_frame("server_stopping", "the service is stopping; resume the stream after its restart "
                       f"from sequence number {last} (starting_after or Last-Event-ID)")


def wants_sse(req: falcon.Request) -> bool:
    accept = req.get_header("Accept") or ""
    return any(part.split(";")[0].strip().lower() == SSE_TYPE for part in accept.split(","))


def start_sse(resp: falcon.Response, stream: Iterator[bytes], status: int = 200,
              headers: dict[str, str] | None = None) -> None:
    resp.status = status
    resp.content_type = SSE_TYPE + "; charset=utf-8"
    resp.set_header("Cache-Control", "no-cache")
    resp.set_header("X-Accel-Buffering", "no")
    for name, value in (headers or {}).items():
        resp.set_header(name, value)
    resp.stream = stream


def event_stream(store, runtime, task_id: str, *, after: int = 0, client_id: str | None = None,
                 heartbeat: float = 15.0, on_abandon: Callable[[], None] | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 poll: float = POLL_SECONDS,
                 authorized: Callable[[], bool] | None = None) -> Iterator[bytes]:
    """SSE frames of ``task_id``'s events after ``after``, then live ones.

    ``on_abandon`` runs when the consumer closes the stream before its end
    (the client went away). ``authorized`` is asked every
    :data:`AUTH_RECHECK_SECONDS` while the stream is open: once it says no
    (the reader's client was revoked), the stream ends with an
    ``unauthorized`` error event, and the task runs on.
    """
    last = after
    generation = getattr(runtime, "commit_generation", None)
    committed = getattr(runtime, "committed_events", None)
    checked = False  # the store has answered once: the task exists and the client may read it
    since = None
    finished = False
    last_write = last_auth = monotonic()
    busy_since = None
    wake_at = after
    try:
        while True:
            if authorized is not None and monotonic() - last_auth >= AUTH_RECHECK_SECONDS:
                last_auth = monotonic()
                try:
                    allowed = authorized()
                except Unavailable:  # a busy store: ask again at the next check
                    allowed = True
                if not allowed:
                    raise Unauthorized("the client of this stream was revoked")
            try:
                since = generation() if generation is not None else None
                fresh = committed(task_id, last) if checked and committed is not None else None
                if fresh:
                    page = {"data": fresh, "has_more": False}
                else:
                    page = store.events(task_id, after=last, limit=PAGE, client_id=client_id)
                    checked = True
            except Unavailable as exc:
                busy_since = _busy(exc, busy_since, monotonic, poll)
                continue
            busy_since = None
            for event in page["data"]:
                last = wake_at = event["sequence_number"]
                if event["type"] in TERMINAL_EVENTS:
                    finished = True
                    yield frame(event)
                    return
                yield frame(event)
                last_write = monotonic()
            if page["has_more"]:
                continue
            if not page["data"]:
                try:
                    task = store.get_task(task_id, client_id)
                except Unavailable as exc:
                    busy_since = _busy(exc, busy_since, monotonic, poll)
                    continue
                counter = task.get("last_sequence_number", last)
                if task["status"] in FINISHED_TASK_STATES and counter <= last:
                    finished = True
                    return
                # a stream that starts past the task's last event waits for the task's next
                # one (its end included), not for one past its own start
                wake_at = min(last, counter)
            if getattr(runtime, "streams_ending", False):
                finished = True  # not abandoned: the task runs on, or follows its restart policy
                yield stopping_frame(last)
                return
            idle = monotonic() - last_write
            if idle >= heartbeat:
                yield KEEP_ALIVE
                last_write = monotonic()
                continue
            # a runtime that watches the store wakes the stream when its task moves;
            # otherwise the stream polls
            wait = heartbeat - idle if getattr(runtime, "watches_store", False) else min(poll, heartbeat - idle)
            wait = max(0.001, wait)
            if since is None:
                runtime.wait_for_commit(task_id, wake_at, wait)
            else:
                runtime.wait_for_commit(task_id, wake_at, wait, since=since)
    except LMSPError as exc:
        finished = True
        yield error_frame(exc.code, exc.message, exc.param)
    except Exception:  # noqa: BLE001 - a stream must end with a frame, never a traceback
        finished = True
        log.exception("event stream of %s failed", task_id)
        yield error_frame("internal_error", "the event stream failed")
    finally:
        if not finished and on_abandon is not None:
            try:
                on_abandon()
            except Exception:  # noqa: BLE001
                log.exception("cleanup of the abandoned stream of %s failed", task_id)


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
