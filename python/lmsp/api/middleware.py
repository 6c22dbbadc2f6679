"""Request id, access log, latency, authentication and the error handlers."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, TypeGuard

import falcon

from lmsp import auth
from lmsp.errors import LMSPError, code_for_status
from lmsp.fleet.keys import FLEET_PREFIX
from lmsp.fleet.members import FleetMembers
from lmsp.ids import new_id

from .common import dumps, set_json
from .logs import request_id_var
from .metrics import HttpMetrics

log = logging.getLogger("lmsp.api")
access_log = logging.getLogger("lmsp.access")

REQUEST_ID = "X-Request-Id"


def _valid_request_id(value: str | None) -> TypeGuard[str]:
    return value is not None and 0 < len(value) <= 128 and all(33 <= ord(ch) < 127 for ch in value)


class RequestContext:
    """Request id in and out, one access log line and the latency histogram."""

    def __init__(self, http_metrics: HttpMetrics | None, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.http_metrics = http_metrics
        self.monotonic = monotonic

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.started = self.monotonic()
        incoming = req.get_header(REQUEST_ID)
        rid = incoming if _valid_request_id(incoming) else new_id("req")
        req.context.request_id = rid
        req.context.client = None
        request_id_var.set(rid)
        resp.set_header(REQUEST_ID, rid)

    def process_response(
        self, req: falcon.Request, resp: falcon.Response, resource: object, req_succeeded: bool
    ) -> None:
        started = getattr(req.context, "started", None)
        elapsed = self.monotonic() - started if started is not None else 0.0
        status = resp.status_code if hasattr(resp, "status_code") else int(str(resp.status)[:3])
        route = req.uri_template or "unmatched"
        if self.http_metrics is not None:
            self.http_metrics.observe(req.method, route, status, elapsed)
        client = getattr(req.context, "client", None)
        access_log.info(
            "%s %s %s",
            req.method,
            req.path,
            status,
            extra={
                "request_id": getattr(req.context, "request_id", None),
                "method": req.method,
                "path": req.path,
                "route": route,
                "status": status,
                "duration_ms": round(elapsed * 1000, 2),
                "client_id": client["id"] if client else None,
                "streamed": resp.stream is not None,
            },
        )
        request_id_var.set(None)


#: a client's ``last_seen_at`` is written at most once in this many seconds
SEEN_EVERY = 60.0


class Authentication:
    """Bearer token and scope check for every route that declares a scope.

    A resource declares ``scopes = {"GET": "responses:read", ...}``; a method
    mapped to None is public; a method it does not list is left to Falcon
    (405). Resources without ``scopes`` are public.

    An authenticated request moves its client's ``last_seen_at`` when that is
    ``SEEN_EVERY`` seconds old, by the row just read and by this worker's own
    note of its last write, so that a burst of requests writes once.
    """

    def __init__(self, store: Any, clock: Callable[[], float] = time.time, fleet: FleetMembers | None = None) -> None:
        self.store = store
        self.clock = clock
        self.fleet = fleet
        self.seen: dict[str, float] = {}  # client id -> when this worker last wrote it

    def process_resource(
        self, req: falcon.Request, resp: falcon.Response, resource: object, params: dict[str, Any]
    ) -> None:
        scopes = getattr(resource, "scopes", None)
        if not scopes or req.method not in scopes:
            return
        needed = scopes[req.method]
        if needed is None:
            return
        header = req.get_header("Authorization")
        if self.fleet is not None and auth.bearer_token(header).startswith(FLEET_PREFIX):
            client = self.fleet.authenticate(auth.bearer_token(header))
        else:
            client = auth.authenticate(self.store, header)
        req.context.client = client
        self.note_seen(client)
        auth.require_scope(client, needed)

    def note_seen(self, client: dict[str, Any]) -> None:
        now, cid = self.clock(), client["id"]
        stored = client.get("last_seen_at")
        if (stored is not None and now - stored < SEEN_EVERY) or now - self.seen.get(cid, -SEEN_EVERY) < SEEN_EVERY:
            return
        if len(self.seen) > 10_000:  # clients long gone
            self.seen.clear()
        self.seen[cid] = now  # before the write: the requests meanwhile do not write too
        try:
            self.store.note_seen(cid, SEEN_EVERY)
        except LMSPError as exc:  # a busy store: the request goes on, the next minute tries again
            log.info("last seen of %s not written: %s", cid, exc.message)


# -- error handlers ---------------------------------------------------------


def handle_lmsp_error(req: falcon.Request, resp: falcon.Response, ex: LMSPError, params: dict[str, Any]) -> None:
    resp.stream = None
    set_json(resp, ex.body(), ex.status, ex.headers, ascii_only=True)
    if ex.status >= 500:
        log.warning("request refused: %s", ex.message, extra={"code": ex.code, "status": ex.status})


def handle_http_error(req: falcon.Request, resp: falcon.Response, ex: falcon.HTTPError, params: dict[str, Any]) -> None:
    """Falcon's own errors (unknown route, 405, bad query string) as B.1 bodies."""
    status = ex.status_code
    code = code_for_status(status)
    if status == 404:
        message = f"no route for {req.method} {req.path}"
    elif status == 405:
        message = f"method {req.method} is not allowed on {req.path}"
    else:
        message = ex.description or ex.title or "request refused"
    resp.stream = None
    set_json(
        resp,
        {"error": {"code": code, "message": message, "param": None}},
        status,
        dict(ex.headers or {}),
        ascii_only=True,
    )


def handle_unexpected(req: falcon.Request, resp: falcon.Response, ex: Exception, params: dict[str, Any]) -> None:
    """Any other exception: logged with its traceback, answered without details."""
    if isinstance(ex, falcon.HTTPStatus):
        resp.status = ex.status
        if ex.headers:
            resp.set_headers(ex.headers)
        resp.text = ex.text
        return
    log.error(
        "unhandled error on %s %s",
        req.method,
        req.path,
        exc_info=ex,
        extra={"request_id": getattr(req.context, "request_id", None)},
    )
    resp.stream = None
    rid = getattr(req.context, "request_id", None)
    message = "internal error" + (f" (request id {rid})" if rid else "")
    set_json(resp, {"error": {"code": "internal_error", "message": message, "param": None}}, 500)


def error_frame(code: str, message: str, param: str | None = None, sequence_number: int = 0) -> bytes:
    """The SSE ``error`` event of a stream that cannot go on: OpenAI's fields, and Open
    Responses' ``error`` object. Not an event of the task's log: no ``id`` line, and
    ``sequence_number`` is that of the last event sent (0: none)."""
    error = {"type": "stream_error", "code": code, "message": message, "param": param}
    data = dumps(
        {
            "type": "error",
            "sequence_number": sequence_number,
            "code": code,
            "message": message,
            "param": param,
            "error": error,
        },
        ascii_only=True,
    )
    return f"event: error\ndata: {data}\n\n".encode("utf-8")
