"""Server-sent events (LMSP B.6): LMSP's framing of a task's events, and the
response that carries a stream (:mod:`lmsp.service.streams` reads the events).
"""

from __future__ import annotations

from typing import Any, Iterator

import falcon

from .common import SSE_TYPE, dumps
from .middleware import error_frame

# a comment line alone, with no blank line after it: a decoder that keeps the last event id
# (the openai package) dispatches an empty event at every blank line once it has seen one
KEEP_ALIVE = b": keep-alive\n"


def frame(event: dict[str, Any]) -> bytes:
    """One event in SSE framing: ``id``, ``event``, ``data``, blank line."""
    return (f"id: {event['sequence_number']}\nevent: {event['type']}\ndata: {dumps(event)}\n\n").encode("utf-8")


class SseFraming:
    """How a stream writes its task's events and the error that ends it: as LMSP's SSE
    frames here; the OpenAI endpoints write theirs (``lmsp.api.openai_shapes``). An
    event that gives no bytes is not written (:class:`lmsp.service.streams.Framing`)."""

    keep_alive = KEEP_ALIVE

    def event(self, event: dict[str, Any]) -> bytes:
        return frame(event)

    def error(self, code: str, message: str, param: str | None = None, sequence_number: int = 0) -> bytes:
        return error_frame(code, message, param, sequence_number)

    def stopping(self, last: int) -> bytes:
        """The ``server_stopping`` error that ends a stream when the worker stops (not a
        response event: the task follows its restart policy, and its event log is read
        again after the restart, from the event after ``last``)."""
        return self.error(
            "server_stopping",
            "the service is stopping; resume the stream after its restart "
            f"from sequence number {last} (starting_after or Last-Event-ID)",
            sequence_number=last,
        )


SSE_FRAMES = SseFraming()


def stopping_frame(last: int, framing: SseFraming = SSE_FRAMES) -> bytes:
    """The error that ends a stream when the worker stops, as ``framing`` writes it."""
    return framing.stopping(last)


def wants_sse(req: falcon.Request) -> bool:
    accept = req.get_header("Accept") or ""
    return any(part.split(";")[0].strip().lower() == SSE_TYPE for part in accept.split(","))


def start_sse(
    resp: falcon.Response, stream: Iterator[bytes], status: int = 200, headers: dict[str, str] | None = None
) -> None:
    resp.status = status
    resp.content_type = SSE_TYPE + "; charset=utf-8"
    resp.set_header("Cache-Control", "no-cache")
    resp.set_header("X-Accel-Buffering", "no")
    for name, value in (headers or {}).items():
        resp.set_header(name, value)
    resp.stream = stream
