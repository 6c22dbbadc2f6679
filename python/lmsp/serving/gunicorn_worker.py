"""gunicorn's gevent worker, with gevent imported in the worker process only.

gunicorn builds each worker object in the master and then forks, so naming
``gevent`` as the worker class imports gevent into the master (about 20 MB of
its resident memory on CPython 3.11), where it never runs: the master serves
no request. :class:`GeventWorker` is gunicorn's own gevent worker, loaded
after the fork. Until then the object is an ``AsyncWorker``, the class
gunicorn's gevent worker is built on (same constructor, no gevent), and
``init_process``, the first thing a forked worker runs, makes it the real
one and continues as it.

The real one differs from gunicorn's in four ways: a SIGTERM first drains
this process's runtimes and winds the worker down (:mod:`lmsp.serving.winddown`);
what gunicorn answers itself (a request it cannot parse, one over its size
limits, an exception that escapes the app) gets the JSON error body of LMSP
B.1 instead of gunicorn's HTML page; the app's ``Connection: close`` closes
the connection; and connections waiting for a request are bounded
(:mod:`lmsp.serving.idle_connections`): a new connection has ``header_timeout``
seconds for its first request head, and the oldest idle connections are
closed beyond ``max_idle_per_address`` per client address or
``max_idle_connections`` in all.
"""

from __future__ import annotations

import http
import importlib
import json
import ssl
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gunicorn import util
from gunicorn.http import errors as http_errors
from gunicorn.workers.base_async import AsyncWorker

from lmsp.errors import code_for_status
from lmsp.ids import new_id

if TYPE_CHECKING:
    # the mixins below are only ever bases of gunicorn's gevent worker, which the
    # master must not import (see above): a base for the type checker alone
    from gunicorn.workers.ggevent import GeventWorker as _Worker

    from lmsp.serving.winddown import WindDown
else:
    _Worker = object


_serving_class: type[_Worker] | None = None

# what a message may quote of the request (a header name, a method): this many characters at most
_QUOTE_MAX = 40


def _quote(value) -> str:
    """A short, printable rendering of something the client sent."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if isinstance(value, tuple):
        value = ".".join(str(part) for part in value)
    text = "".join(ch if " " <= ch < "\x7f" else "?" for ch in str(value))
    return text if len(text) <= _QUOTE_MAX else text[:_QUOTE_MAX] + "..."


def _header_message(exc) -> str:
    name = str(getattr(exc, "hdr", "") or "")
    upper = name.upper()
    if upper == "CONTENT-LENGTH":
        return "the Content-Length header is invalid, repeated or sent along with Transfer-Encoding"
    if upper == "TRANSFER-ENCODING":
        return "the Transfer-Encoding header is invalid (it must end with chunked, once)"
    if "bare LF" in name:
        return "a header line ends with a bare LF (lines must end with CRLF)"
    if isinstance(exc, http_errors.InvalidHeaderName):
        return f"invalid header field name: {_quote(name)}"
    return f"invalid header field: {_quote(name)}"


def _limit_message(exc, cfg) -> str:
    what = str(exc)
    if what == "limit request headers fields":
        return f"the request has more than {cfg.limit_request_fields} header fields"
    if what == "limit request headers fields size":
        return f"a request header field is longer than {cfg.limit_request_field_size} bytes"
    if "trailer" in what:
        return "the request's trailer section is too large"
    return "the request's header section is too large"


def _is(exc, *names: str) -> bool:
    """Whether ``exc`` is one of gunicorn's parse errors of these names; a name that the
    installed gunicorn does not have (an older one) matches nothing."""
    kinds = tuple(kind for kind in (getattr(http_errors, name, None) for name in names) if kind is not None)
    return bool(kinds) and isinstance(exc, kinds)


# gunicorn's refusals that need no detail of the request: (its error class, status, message).
# Looked at first: the response-header errors are kinds of the request-header ones.
_FIXED = (
    ("InvalidResponseHeader", 500, "internal error"),  # the app's fault
    ("InvalidResponseHeaderName", 500, "internal error"),
    ("ConfigurationProblem", 500, "internal error"),  # the server's
    ("InvalidRequestLine", 400, "invalid HTTP request line"),
    ("ExpectationFailed", 417, "unsupported Expect header (only 100-continue is accepted)"),
    ("InvalidChunkSize", 400, "invalid chunked body: a chunk size is not a hexadecimal number"),
    ("ChunkMissingTerminator", 400, "invalid chunked body: a chunk does not end with CRLF"),
    ("InvalidChunkExtension", 400, "invalid chunked body: invalid chunk extension"),
    ("InvalidSchemeHeaders", 400, "contradictory scheme headers (X-Forwarded-Proto and the like)"),
    ("InvalidProxyLine", 400, "invalid PROXY protocol line"),
    ("ForbiddenProxyRequest", 403, "PROXY protocol requests are not accepted from this address"),
    ("InvalidH2CPreface", 400, "expected the HTTP/2 connection preface"),
)


def refusal(exc, cfg) -> tuple[int, str]:
    """The HTTP status and the message for an exception that gunicorn answers
    itself: the status gunicorn's own ``Worker.handle_error`` gives it, and a
    message that names the problem and quotes no more than a few characters of
    the request. Anything that is not the client's fault is a 500 (the caller
    adds the request id to its message)."""
    for name, status, message in _FIXED:
        if _is(exc, name):
            return status, message
    if _is(exc, "InvalidRequestMethod"):
        return 400, f"invalid HTTP method: {_quote(exc.method)}"
    if _is(exc, "InvalidHTTPVersion"):
        return 400, f"unsupported HTTP version: {_quote(exc.version)} (the service speaks HTTP/1.0 and 1.1)"
    if _is(exc, "UnsupportedTransferCoding"):
        return 501, f"unsupported transfer coding: {_quote(exc.hdr)}"
    if _is(exc, "ObsoleteFolding"):
        return 400, f"obsolete line folding in header field {_quote(exc.hdr)}"
    if _is(exc, "InvalidHeaderName", "InvalidHeader"):
        return 400, _header_message(exc)
    if _is(exc, "LimitRequestLine"):
        return 414, f"the request line is longer than {cfg.limit_request_line} bytes"
    if _is(exc, "LimitRequestHeaders"):
        return 431, _limit_message(exc, cfg)
    if isinstance(exc, ssl.SSLError):
        return 403, "TLS handshake failed"
    if isinstance(exc, http_errors.ParseException):  # one this list does not know yet
        status = getattr(exc, "code", 400)
        return (
            (status, "malformed HTTP request")
            if isinstance(status, int) and 400 <= status < 500
            else (500, "internal error")
        )
    return 500, "internal error"


# reason phrases where RFC 9110 renamed what Python's http.HTTPStatus still calls otherwise
_REASONS = {413: "Content Too Large", 414: "URI Too Long"}


def error_response(status: int, code: str, message: str, request_id: str, *, body: bool = True) -> bytes:
    """A whole HTTP/1.1 response carrying the B.1 error body; the connection closes after it."""
    payload = json.dumps(
        {"error": {"code": code, "message": message, "param": None}}, ensure_ascii=True, separators=(",", ":")
    ).encode("ascii")
    reason = _REASONS.get(status) or http.HTTPStatus(status).phrase
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n"
        f"X-Request-Id: {request_id}\r\n"
        "\r\n"
    ).encode("ascii")
    return head + payload if body else head


class JSONErrors(_Worker):
    """``handle_error`` of gunicorn's worker with a B.1 body instead of an HTML page.

    gunicorn calls it for a request it refuses while parsing (a bad request line
    or header, limits, a bad chunked body met while draining it) and for an
    exception that escapes the app before the response started. The status is
    the one gunicorn would send; a 500 says nothing but its request id, and its
    traceback goes to the log.
    """

    def handle_error(self, req, client, addr, exc) -> None:
        started = datetime.now()
        addr = addr or ("", -1)  # a unix socket
        status, message = refusal(exc, self.cfg)
        request_id = new_id("req")
        if status == 500:  # the server's fault (501 is a transfer coding the client chose)
            message = f"{message} (request id {request_id})"
            what = " ".join(str(getattr(req, attr)) for attr in ("method", "uri") if hasattr(req, attr))
            self.log.exception("Error handling request %s (request id %s)", what or "(no URI read)", request_id)
        else:
            self.log.warning(
                "Invalid request from ip=%s: %s (answered %s, request id %s)", addr[0], exc, status, request_id
            )
        if req is None and hasattr(exc, "req") and not isinstance(exc, http_errors.InvalidRequestLine):
            req = exc.req
        data = error_response(
            status, code_for_status(status), message, request_id, body=getattr(req, "method", None) != "HEAD"
        )
        if req is not None and hasattr(req, "method"):
            self._access(req, client, addr, status, len(data), started)
        try:
            util.write_nonblock(client, data)
        except Exception:
            self.log.debug("Failed to send error message.")

    def _access(self, req, client, addr, status: int, length: int, started: datetime) -> None:
        """The access log line gunicorn writes for the refused request."""
        from gunicorn.http.wsgi import Response, default_environ

        try:
            environ = default_environ(req, client, self.cfg)
            environ["REMOTE_ADDR"] = addr[0]
            environ["REMOTE_PORT"] = str(addr[1])
            resp = Response(req, client, self.cfg)
            resp.status = f"{status} {_REASONS.get(status) or http.HTTPStatus(status).phrase}"
            resp.response_length = length
            self.log.access(resp, req, environ, datetime.now() - started)
        except Exception:
            self.log.debug("Failed to log the refused request.", exc_info=True)


def _closing(app):
    """``app`` with its ``Connection: close`` obeyed.

    gunicorn drops the hop-by-hop headers a WSGI app sends, so an app that
    answers a request whose body it could not read (too slow, malformed, cut
    short) cannot close the connection by saying so. This wrapper tells
    gunicorn's response (the object behind ``start_response``) to close
    instead, which also makes gunicorn send ``Connection: close``."""

    def wsgi(environ, start_response):
        def start(status, headers, exc_info=None):
            for name, value in headers:
                if name.lower() == "connection" and value.strip().lower() == "close":
                    force_close = getattr(getattr(start_response, "__self__", None), "force_close", None)
                    if force_close is not None:
                        force_close()
                    break
            return start_response(status, headers, exc_info)

        return app(environ, start)

    return wsgi


def _address(addr) -> str:
    """The client address a connection counts against (a unix socket's are all one)."""
    return str(addr[0]) if isinstance(addr, tuple) and addr else "local"


class IdleLimits(_Worker):
    """The idle-connection bounds of the serving worker (see the module docstring).

    Each connection's handler greenlet is known from its accept to its close;
    gunicorn waits for every request head inside ``timeout_ctx()``, which here
    registers the wait with :class:`lmsp.serving.idle_connections.IdleConnections`."""

    def setup_limits(self) -> None:
        from lmsp import config
        from lmsp.serving.idle_connections import IdleConnections

        self.lmsp_config = config.load()
        self.idle = IdleConnections(self.lmsp_config.max_idle_connections, self.lmsp_config.max_idle_per_address)
        self._connections: dict = {}  # handler greenlet -> [client address, first request still to come]
        self.wind_down: WindDown | None = None

    def handle(self, listener, client, addr) -> None:
        import gevent

        current = gevent.getcurrent()
        self._connections[current] = [_address(addr), True]
        try:
            super().handle(listener, client, addr)
        finally:
            self._connections.pop(current, None)

    def timeout_ctx(self):
        import gevent

        connection = self._connections.get(gevent.getcurrent())
        if connection is None:
            return super().timeout_ctx()
        address, first = connection
        connection[1] = False
        seconds = self.lmsp_config.header_timeout if first else self.cfg.keepalive
        return self.idle.waiting(address, seconds)


def _serving(worker_class: type[_Worker]) -> type[_Worker]:
    """gunicorn's gevent worker with B.1 error bodies (:class:`JSONErrors`), the
    app's ``Connection: close`` obeyed (:func:`_closing`) and idle connections
    bounded (:class:`IdleLimits`), which on SIGTERM (a stop, a reload's old
    worker) first tells this process's runtimes to claim no more tasks (a task
    it claimed while its connections keep it alive would wait for its lease to
    run out instead of going to another worker at once) and then winds down
    (:class:`lmsp.serving.winddown.WindDown`)."""
    global _serving_class
    if _serving_class is None:

        class Serving(IdleLimits, JSONErrors, worker_class):  # type: ignore[misc,valid-type]  # a run-time base
            def load_wsgi(self) -> None:
                super().load_wsgi()
                self.wsgi = _closing(self.wsgi)
                # what handle_exit uses, imported here (once gevent has patched
                # the standard library): a stop signal to every process of the
                # service at once (systemd's default, pkill) and the master's
                # own make handle_exit run inside itself, where a module the
                # outer run is still importing cannot be imported
                importlib.import_module("lmsp.runtime.core")
                importlib.import_module("lmsp.serving.winddown")

            def handle_exit(self, sig, frame) -> None:
                from lmsp.runtime import core
                from lmsp.serving.winddown import WindDown

                runtimes = core.started()
                for runtime in runtimes:
                    runtime.drain()
                if self.wind_down is None:
                    self.wind_down = WindDown(
                        runtimes, self.idle, self.lmsp_config.stop_grace_seconds, float(self.cfg.graceful_timeout)
                    )
                super().handle_exit(sig, frame)

        Serving.__name__ = Serving.__qualname__ = worker_class.__name__
        _serving_class = Serving
    return _serving_class


class GeventWorker(AsyncWorker):
    """``gunicorn.workers.ggevent.GeventWorker``, imported once forked."""

    def init_process(self) -> None:
        from gunicorn.workers.ggevent import GeventWorker as Worker

        serving: Any = self  # made the serving worker, which the type checker cannot follow
        serving.__class__ = _serving(Worker)
        serving.setup_limits()
        Worker.init_process(serving)
