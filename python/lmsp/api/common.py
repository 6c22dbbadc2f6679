"""What every resource shares: the dependencies, JSON bodies, query parameters,
path ids, list cursors and pages, and the caller's identity.

Nothing here knows a route; everything raises :mod:`lmsp.errors` exceptions,
which the app's one error handler turns into LMSP B.1 bodies.
"""

from __future__ import annotations

import json
import math
import logging
import re
import time
from dataclasses import dataclass, field
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Callable, Literal, NoReturn, overload

import falcon

from lmsp.auth import is_admin
from lmsp.contracts import RuntimeAPI
from lmsp.serving.hubsafe import gevent_active
from lmsp.wire.structs import Empty, read
from lmsp.wire.options import parse_include
from lmsp.service.accounts import AccountService
from lmsp.service.conversations import ConversationService
from lmsp.service.keys import KeyedActions
from lmsp.service.tasks import Caller, TaskService
from lmsp.errors import InvalidJSON, InvalidRequest, NotFound, PayloadTooLarge, RequestTimeout, UnsupportedMediaType

# what gunicorn raises while it reads a body for the app: a body cut short, a malformed chunked body
_BodyCutShort: tuple[type[Exception], ...] = ()
_MalformedBody: tuple[type[Exception], ...] = ()
try:
    from gunicorn.http.errors import NoMoreData, ParseException

    _BodyCutShort, _MalformedBody = (NoMoreData,), (ParseException,)
except ImportError:  # pragma: no cover - another WSGI server
    pass

if TYPE_CHECKING:
    from lmsp.store import Store

log = logging.getLogger("lmsp.api")

JSON_TYPE = "application/json"
SSE_TYPE = "text/event-stream"


@dataclass
class Deps:
    """The explicit dependencies of the web layer: the services its resources call
    (``tasks``, ``conversations``, ``accounts``, ``keys``, made over ``store`` and
    ``runtime``), the runtime's contract, and the store, which only the health
    resources and the authentication read. ``store``: under gevent through
    :func:`lmsp.serving.hubsafe.hub_safe`, which calls the same methods off the hub."""

    config: Any
    store: Store
    runtime: RuntimeAPI
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    random_seed: Callable[[], int] = None  # type: ignore[assignment]
    http_metrics: Any = None
    tasks: TaskService = field(init=False)
    conversations: ConversationService = field(init=False)
    accounts: AccountService = field(init=False)
    keys: KeyedActions = field(init=False)

    def __post_init__(self) -> None:
        self.tasks = TaskService(self.config, self.store, self.runtime, self.monotonic)
        self.conversations = ConversationService(self.store)
        self.accounts = AccountService(self.config, self.store, self.clock)
        self.keys = KeyedActions(self.store)

    @overload
    def body(self, req: falcon.Request, *, optional: Literal[False] = False) -> dict[str, Any]: ...

    @overload
    def body(self, req: falcon.Request, *, optional: bool) -> dict[str, Any] | None: ...

    def body(self, req: falcon.Request, *, optional: bool = False) -> dict[str, Any] | None:
        """The request's JSON object body, within the configured size and time limits
        (with ``optional``, None for an empty body)."""
        return read_json(req, self.config.max_body_bytes, optional=optional, timeout=self.config.body_timeout)

    def no_body(self, req: falcon.Request) -> dict[str, Any] | None:
        """The body of a POST that takes no fields: none, or an empty object."""
        body = self.body(req, optional=True)
        if body:
            read(body, Empty)
        return body


# -- bodies -----------------------------------------------------------------


def dumps(obj: Any, *, ascii_only: bool = False) -> str:
    return json.dumps(obj, ensure_ascii=ascii_only, separators=(",", ":"))


def set_json(
    resp: falcon.Response,
    obj: Any,
    status: int = 200,
    headers: dict[str, str] | None = None,
    *,
    ascii_only: bool = False,
) -> None:
    """``ascii_only``: every character beyond ASCII escaped, so that any string
    can be written (error bodies, which may quote what a client sent)."""
    resp.status = status
    resp.content_type = JSON_TYPE
    resp.text = dumps(obj, ascii_only=ascii_only)
    for name, value in (headers or {}).items():
        resp.set_header(name, value)


def _media_type(req: falcon.Request) -> tuple[str, dict[str, str]]:
    raw = req.content_type or ""
    main, *rest = raw.split(";")
    params = {}
    for part in rest:
        key, _, value = part.partition("=")
        params[key.strip().lower()] = value.strip().strip('"').lower()
    return main.strip().lower(), params


def read_body(req: falcon.Request, max_bytes: int, timeout: float | None = None) -> bytes:
    """The raw request body, at most ``max_bytes`` (else 413).

    Under gevent the whole body must arrive within ``timeout`` seconds (else
    408 and the connection is closed), so clients that trickle bodies cannot
    hold the worker's connections. A body the server cannot decode (a malformed
    chunk) or that ends early is the client's fault: 400, never a 500.
    """
    kept = getattr(req.context, "raw_body", None)  # read already (lmsp.api.fleet)
    if isinstance(kept, bytes):
        return kept
    length = req.content_length
    if length is not None and length > max_bytes:
        raise PayloadTooLarge(f"the request body is larger than {max_bytes} bytes")
    try:
        data = _read_with_deadline(req, max_bytes + 1, timeout)
    except _MalformedBody:
        raise InvalidRequest(
            "the request body's chunked encoding is invalid (a chunk size, chunk end, extension or trailer)",
            headers={"Connection": "close"},
        ) from None
    except _BodyCutShort:
        raise InvalidRequest(
            "the request body was cut short: the connection closed before its end", headers={"Connection": "close"}
        ) from None
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"the request body is larger than {max_bytes} bytes")
    return data


def _read_upto(req: falcon.Request, size: int) -> bytes:
    """At most ``size`` bytes of the body: as long as its Content-Length says, or, for a
    body sent in chunks (no Content-Length), until its last chunk, which the server
    (gunicorn, gevent's pywsgi) has already decoded."""
    if req.content_length is not None or "chunked" not in (req.get_header("Transfer-Encoding") or "").lower():
        return req.bounded_stream.read(size)
    parts: list[bytes] = []
    left = size
    while left > 0:
        part = req.stream.read(min(left, 65536))
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _read_with_deadline(req: falcon.Request, size: int, timeout: float | None) -> bytes:
    if not timeout or not gevent_active():
        return _read_upto(req, size)
    import gevent

    deadline = gevent.Timeout(timeout)
    deadline.start()
    try:
        return _read_upto(req, size)
    except gevent.Timeout as exc:
        if exc is not deadline:
            raise
        raise RequestTimeout(
            f"the request body did not arrive within {timeout:g} seconds", headers={"Connection": "close"}
        ) from None
    finally:
        deadline.close()


def read_json(
    req: falcon.Request, max_bytes: int, *, optional: bool = False, timeout: float | None = None
) -> dict[str, Any] | None:
    """The request's JSON object body.

    With ``optional``, an empty body (any or no content type) gives None; a
    body that is present must still be a JSON object.
    """
    encoding = (req.get_header("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity":
        raise UnsupportedMediaType(f"compressed request bodies ({encoding}) are not supported")
    data = read_body(req, max_bytes, timeout)
    if not data.strip() and optional:
        return None
    media, params = _media_type(req)
    if media != JSON_TYPE and not (media.startswith("application/") and media.endswith("+json")):
        shown = req.content_type or "none"
        raise UnsupportedMediaType(f"the request body must be application/json (got {shown})")
    charset = params.get("charset")
    if charset not in (None, "utf-8", "utf8"):
        raise UnsupportedMediaType(f"the request body must be UTF-8 JSON (got charset {charset})")
    if not data.strip():
        raise InvalidJSON("the request body is empty; a JSON object is required")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidJSON(f"the request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        body = json.loads(
            text,
            parse_constant=_reject_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
            object_pairs_hook=_unique_keys,
        )
    except ValueError as exc:
        raise InvalidJSON(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidJSON("the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise InvalidJSON("the request body must be a JSON object")
    _check_parsed(body, text)
    return body


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _parse_float(literal: str) -> float | int:
    """A number with a fraction or exponent, as JSON means it: an integral one is the
    integer (``5.0`` where an integer is due); one beyond any float is refused."""
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"the number {literal[:40]} is beyond the range of a double")
    return int(value) if value.is_integer() else value


def _parse_int(digits: str) -> int:
    """An integer of the body; one too long for Python to read (4300 digits by default)
    is refused as what it is, not with the interpreter's setting."""
    try:
        return int(digits)
    except ValueError:
        raise InvalidJSON(
            f"the request body has a number of {len(digits.lstrip('-'))} digits; no field takes a number that long"
        ) from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object of the body: a key given twice is refused (parsers disagree on which value counts)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                shown = repr(key) if len(key) <= 64 else repr(key[:64]) + "..."
                raise InvalidJSON(f"the request body has the key {shown} twice in one object")
            seen.add(key)
    return out


MAX_DEPTH = 32  # arrays and objects within one another; a request of B.5 needs 5


def _check_parsed(body: dict[str, Any], text: str) -> None:
    """What ``json.loads`` lets through and nothing downstream can take: a lone
    surrogate escape (``"\\ud800"``: a string no UTF-8 file, database or answer
    can hold) and nesting deeper than :data:`MAX_DEPTH`. The body is walked only
    when its text could hold either."""
    surrogates = "\\ud" in text or "\\uD" in text
    if not surrogates and text.count("[") + text.count("{") <= MAX_DEPTH:
        return
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise InvalidJSON(f"the request body is nested more than {MAX_DEPTH} levels deep")
            if isinstance(value, dict) and surrogates:
                for key in value:
                    _check_text(key)
            items = value.values() if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)
        elif surrogates and isinstance(value, str):
            _check_text(value)


def _check_text(value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidJSON(
            f"the request body has a lone surrogate (\\u{ord(value[exc.start]):04x}) in a "
            "string; JSON strings must escape whole characters"
        ) from None


# -- query parameters -------------------------------------------------------


def query_str(
    req: falcon.Request, name: str, *, choices: Collection[str] | None = None, default: str | None = None
) -> str | None:
    values = req.get_param_as_list(name)
    if not values:
        return default
    if len(values) > 1:
        raise InvalidRequest(f"query parameter {name!r} is given more than once", param=name)
    value = values[0]
    if choices is not None and value not in choices:
        raise InvalidRequest(f"query parameter {name!r} must be one of {', '.join(choices)}", param=name)
    return value


INT64_MAX = 2**63 - 1  # the store's integers are SQLite's: 64 bits
_DECIMAL = re.compile(r"-?[0-9]{1,30}")


def query_int(
    req: falcon.Request, name: str, *, default: Any = None, minimum: int | None = None, maximum: int = INT64_MAX
) -> Any:
    """The parameter as an integer (Any: an int, or the default)."""
    raw = query_str(req, name)
    if raw is None:
        return default
    if not _DECIMAL.fullmatch(raw):  # (int() also takes "1_0", " 3", "+3" and non-ASCII digits)
        raise InvalidRequest(f"query parameter {name!r} must be an integer", param=name)
    value = int(raw)
    if minimum is not None and value < minimum:
        raise InvalidRequest(f"{name!r} must be at least {minimum}", param=name)
    if value > maximum:
        raise InvalidRequest(f"{name!r} must be at most {maximum}", param=name)
    return value


def query_bool(req: falcon.Request, name: str, *, default: bool = False) -> bool:
    raw = query_str(req, name)
    if raw is None:
        return default
    low = raw.lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise InvalidRequest(f"query parameter {name!r} must be true or false", param=name)


def header_int(req: falcon.Request, name: str) -> int | None:
    raw = req.get_header(name)
    if raw is None or not raw.strip():
        return None
    if not _DECIMAL.fullmatch(raw.strip()):
        raise InvalidRequest(f"header {name!r} must be a non-negative integer", param=name)
    value = int(raw.strip())
    if value < 0:
        raise InvalidRequest(f"header {name!r} must be a non-negative integer", param=name)
    if value > INT64_MAX:
        raise InvalidRequest(f"header {name!r} must be at most {INT64_MAX}", param=name)
    return value


# -- identity ---------------------------------------------------------------


def caller(req: falcon.Request) -> dict[str, Any]:
    client: dict[str, Any] = req.context.client
    return client


def request_caller(req: falcon.Request) -> Caller:
    """Who sends the request, and whether the cap on unfinished tasks applies to it
    (an admin's are not capped)."""
    client = caller(req)
    return Caller(client["id"], limited=not is_admin(client))


def owner_filter(req: falcon.Request) -> str | None:
    """The client id reads are limited to: None (everything) for an admin."""
    client = caller(req)
    return None if is_admin(client) else client["id"]


def check_id(value: str, prefix: str, what: str) -> str:
    """An id from a path: a wrong prefix can only be an unknown id (404)."""
    if not value.startswith(prefix + "_") or len(value) > 100:
        raise NotFound(f"no {what} with id {value!r}")
    return value


def check_cursor(value: str, prefix: str) -> None:
    if not value.startswith(prefix + "_") or len(value) > 100:
        raise InvalidRequest(f"'after' must be an id starting with {prefix}_", param="after")


def stream_start(req: falcon.Request, param: str) -> int:
    """Where a resumed stream starts: ``Last-Event-ID`` wins over the query."""
    last_event_id = header_int(req, "Last-Event-ID")
    if last_event_id is not None:
        return last_event_id
    start: int = query_int(req, param, default=0, minimum=0)
    return start


MAX_CURSOR = 256


def page_query(req: falcon.Request) -> dict[str, Any]:
    """The page a list request asks for: ``after``, ``before``, ``limit``, ``order``;
    ``include`` is checked (the items listed carry all there is)."""
    out: dict[str, Any] = {
        "limit": query_int(req, "limit", default=20, minimum=1, maximum=100),
        "order": query_str(req, "order", choices=("asc", "desc"), default="desc"),
    }
    for name in ("after", "before"):
        value = query_str(req, name)
        if value is not None and not 0 < len(value) <= MAX_CURSOR:
            raise InvalidRequest(f"query parameter {name!r} must be an item id", param=name)
        out[name] = value
    include = req.get_param_as_list("include") or req.get_param_as_list("include[]")
    parse_include(include)
    return out
