"""The one exception tree of the service.

Every error a client can see is an :class:`LMSPError` carrying the HTTP status,
the LMSP error code and a message; the web layer turns it into the error body
of LMSP B.1 in one handler. Lower layers (the store, the model registry) raise
these directly, so nothing in between needs to translate.
"""

from __future__ import annotations


# The error code of a refusal that carries only an HTTP status: Falcon's own errors
# (unknown route, wrong method) and what the HTTP server refuses before the app
# sees the request (lmsp.serving.gunicorn_worker).
HTTP_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "insufficient_scope",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    411: "length_required",
    413: "payload_too_large",
    414: "uri_too_long",
    415: "unsupported_media_type",
    417: "expectation_failed",
    422: "invalid_request",
    429: "rate_limited",
    431: "headers_too_large",
    500: "internal_error",
    501: "not_implemented",
    503: "unavailable",
}


def code_for_status(status: int) -> str:
    """The error code for an HTTP status alone (:data:`HTTP_CODES`)."""
    return HTTP_CODES.get(status, "invalid_request" if status < 500 else "internal_error")


class LMSPError(Exception):
    status = 400
    code = "invalid_request"

    def __init__(
        self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = dict(headers or {})
        if code is not None:
            self.code = code

    def body(self) -> dict:
        return {"error": {"code": self.code, "message": self.message, "param": self.param}}


class InvalidRequest(LMSPError):
    status, code = 400, "invalid_request"


class InvalidJSON(LMSPError):
    status, code = 400, "invalid_json"


class ContextLengthExceeded(LMSPError):
    status, code = 400, "context_length_exceeded"


class Unauthorized(LMSPError):
    status, code = 401, "unauthorized"

    def __init__(self, message: str = "a valid bearer token is required", **kw) -> None:
        kw.setdefault("headers", {"WWW-Authenticate": "Bearer"})
        super().__init__(message, **kw)


class InsufficientScope(LMSPError):
    status, code = 403, "insufficient_scope"


class NotFound(LMSPError):
    status, code = 404, "not_found"


class Conflict(LMSPError):
    status, code = 409, "conflict"


class IdempotencyKeyInUse(Conflict):
    code = "idempotency_key_in_use"


class TaskFinished(Conflict):
    code = "task_finished"


class TaskUnfinished(Conflict):
    code = "task_unfinished"


class ConversationBusy(Conflict):
    code = "conversation_busy"


class ModelInUse(Conflict):
    code = "model_in_use"


class ModelChanged(Conflict):
    code = "model_changed"


class ModelNotGenerative(LMSPError):
    """An embedding model asked to generate text (LMSP B.12)."""

    status, code = 400, "model_not_generative"


class PayloadTooLarge(LMSPError):
    status, code = 413, "payload_too_large"


class RequestTimeout(LMSPError):
    status, code = 408, "request_timeout"


class UnsupportedMediaType(LMSPError):
    status, code = 415, "unsupported_media_type"


class IdempotencyKeyReused(LMSPError):
    status, code = 422, "idempotency_key_reused"


class RateLimited(LMSPError):
    status, code = 429, "rate_limited"

    def __init__(self, message: str, *, retry_after: int = 1, **kw) -> None:
        kw.setdefault("headers", {"Retry-After": str(retry_after)})
        super().__init__(message, **kw)


class QuotaExceeded(RateLimited):
    """A client's tokens for this hour are spent (its ``tokens_per_hour``)."""

    code = "quota_exceeded"


class Unavailable(LMSPError):
    status, code = 503, "unavailable"

    def __init__(self, message: str, *, retry_after: int = 1, **kw) -> None:
        kw.setdefault("headers", {"Retry-After": str(retry_after)})
        super().__init__(message, **kw)


class BoxUnavailable(Unavailable):
    """A box of the fleet that holds the id asked for cannot be reached (never a 404:
    the id exists, on a box that is down)."""

    code = "box_unavailable"


class ModelLoadFailed(LMSPError):
    """The engine cannot load a registered model's file. The client that asked
    for the load gets 503 ``unavailable`` when memory ran out (the model may
    fit once others are unloaded) or an RPC server it is split over does not
    answer, else 400 ``invalid_request`` (not a file
    this engine can run); a task that needed the model fails with
    :attr:`task_code`."""

    task_code = "model_load_failed"

    def __init__(self, message: str, *, out_of_memory: bool = False, unreachable: bool = False) -> None:
        self.unreachable = unreachable  # an RPC server the model is split over does not answer
        if out_of_memory or unreachable:
            super().__init__(message, headers={"Retry-After": "30"}, code=Unavailable.code)
            self.status = Unavailable.status
        else:
            super().__init__(message)


class IllegalTransition(Conflict):
    """A task state change that LMSP does not allow; nothing was changed."""

    code = "illegal_transition"

    def __init__(self, task_id: str, current: str, target: str) -> None:
        super().__init__(f"task {task_id} cannot go from {current} to {target}")
        self.task_id, self.current, self.target = task_id, current, target
