"""The OpenAPI 3.1 document of the whole API, served at ``/openapi.json``.

Kept true by ``tests/api/test_openapi.py``: every route of the app is here
with the same methods (and nothing else is), and the bodies the API tests get
validate against the schemas of ``openapi_schemas``.
"""

from __future__ import annotations

import copy
from typing import Iterable

import lmsp
from lmsp.contracts import TASK_STATES

from . import console, openapi_conversations, openapi_openai
from .openapi_schemas import INT64_MAX, JSON, RESPONSE_STATUSES, SCHEMAS, SECURITY_SCHEMES, STR, ref, text

ERRORS_BY_STATUS = {
    "400": "invalid_request, invalid_json, context_length_exceeded or model_not_generative",
    "401": "unauthorized: missing, unknown or revoked token",
    "403": "insufficient_scope",
    "404": "not_found (also another client's response or task)",
    "409": ("idempotency_key_in_use, task_finished, task_unfinished, model_in_use, model_changed or conversation_busy"),
    "408": "request_timeout: the body did not arrive within body_timeout (the connection is closed)",
    "413": "payload_too_large",
    "415": "unsupported_media_type",
    "422": "idempotency_key_reused",
    "429": "rate_limited or quota_exceeded (with Retry-After)",
    "503": "unavailable (with Retry-After)",
}

SSE = {
    "text/event-stream": {
        "schema": {
            "type": "string",
            "description": (
                "Frames `id: N`, `event: <type>`, `data: <Event JSON>`, blank line; `: keep-alive` comments "
                "on idle streams; the stream ends after the terminal event."
            ),
        }
    }
}


def _json(schema_name: str, description: str) -> JSON:
    return {"description": description, "content": {"application/json": {"schema": ref(schema_name)}}}


def _errors(*statuses: str) -> JSON:
    return {
        s: {"description": ERRORS_BY_STATUS[s], "content": {"application/json": {"schema": ref("Error")}}}
        for s in statuses
    }


def _param(name: str, where: str, schema: JSON, description: str = "", required: bool = False) -> JSON:
    out: JSON = {"name": name, "in": where, "schema": schema, "required": required or where == "path"}
    if description:
        out["description"] = description
    return out


IDEMPOTENCY = _param(
    "Idempotency-Key",
    "header",
    text(1, 255, "^[ -~]*$"),
    "B.8: a replay gets the stored answer with `Idempotent-Replayed: true`.",
)
AUTH_ERRORS = ("401", "403", "503")  # every authenticated call reads the store


def _op(
    summary: str,
    responses: JSON,
    *,
    scope: str | None,
    params: Iterable[JSON] = (),
    body: str | None = None,
    errors: Iterable[str] = (),
    optional_body: bool = False,
) -> JSON:
    op: JSON = {"summary": summary, "responses": {**responses, **_errors(*errors)}}
    if scope is None:
        op["security"] = []
    else:
        op["security"] = [{"bearer": []}]
        op["x-lmsp-scope"] = scope
        op["responses"].update(_errors(*AUTH_ERRORS))
    if params:
        op["parameters"] = list(params)
    if body is not None:
        op["requestBody"] = {"required": not optional_body, "content": {"application/json": {"schema": ref(body)}}}
    return op


def _with_head(get: JSON) -> JSON:
    """A GET and its HEAD: the same status and headers, without the body."""
    head = {
        "summary": get["summary"] + " (HEAD: the GET's status and headers, no body)",
        "security": get["security"],
        "responses": {status: {"description": answer["description"]} for status, answer in get["responses"].items()},
    }
    return {"get": get, "head": head}


def _id(name: str, prefix: str) -> JSON:
    """Any other value is an id that cannot exist: 404, as for an unknown one."""
    return _param(name, "path", text(0, 100, f"^{prefix}_"), f"An id starting with `{prefix}_`.")


def _list_params(prefix: str) -> tuple[JSON, JSON]:
    return (
        _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}),
        _param("after", "query", text(0, 100, f"^{prefix}_"), "The last id of the previous page."),
    )


NO_FIELDS: JSON = {"body": "Empty", "optional_body": True}
BODY_ERRORS = ("400", "408", "413", "415")  # what a call with a JSON body may get besides its own
LAST_EVENT_ID = {"type": "integer", "minimum": 0, "maximum": INT64_MAX}
SEQUENCE = {"type": "integer", "minimum": 0, "maximum": INT64_MAX}


def _paths() -> JSON:
    openai = openapi_openai.paths(_op, _param, IDEMPOTENCY, BODY_ERRORS)
    turns = openapi_conversations.paths(_op, _param, IDEMPOTENCY, BODY_ERRORS, _id)
    return {
        **_service_paths(),
        **_console_paths(),
        **_client_paths(),
        **_model_paths(),
        **_response_paths(),
        **_task_paths(),
        **openai,
        **turns,
    }


def _service_paths() -> JSON:
    """The service, its probes, its metrics and this document."""
    return {
        "/v1/service": {
            "get": _op("The service and what it can do", {"200": _json("Service", "The service")}, scope=None)
        },
        "/v1/service/history": {
            "get": _op(
                "The service's own history by minute, oldest first: tokens/s, queue, TTFT, errors, disk use",
                {"200": _json("ServiceHistory", "The minutes")},
                scope="models:read",
                params=(
                    _param(
                        "minutes",
                        "query",
                        {"type": "integer", "minimum": 1, "maximum": 1440, "default": 60},
                        "How many minutes back from now.",
                    ),
                ),
                errors=("400",),
            )
        },
        "/healthz": _with_head(_op("Liveness", {"200": _json("Status", "The process answers")}, scope=None)),
        "/readyz": _with_head(
            _op("Readiness: start-up recovery has run", {"200": _json("Status", "Ready")}, scope=None, errors=("503",))
        ),
        "/metrics": _with_head(
            _op(
                "Prometheus text exposition",
                {"200": {"description": "Metrics", "content": {"text/plain": {"schema": STR}}}},
                scope=None,
            )
        ),
        "/v1/fleet/revoked": {
            "get": _op(
                "The clients this box of a fleet paired and revoked, for its peers "
                "(Authorization: Fleet TIME.SIGNATURE, signed with the fleet key)",
                {
                    "200": {
                        "description": "Revoked client ids",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
                scope=None,
                errors=("401",),
            )
        },
        "/openapi.json": {
            "get": _op(
                "This document",
                {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
                scope=None,
            )
        },
    }


def _console_paths() -> JSON:
    """The operator's page and its files: no token (the page asks for one and calls this API)."""
    paths: JSON = {}
    for path, name, content_type in console.FILES:
        media = content_type.split(";")[0]
        paths[path] = _with_head(
            _op(
                f"The operator's console: {name}",
                {"200": {"description": name, "content": {media: {"schema": STR}}}},
                scope=None,
            )
        )
    return paths


def _client_paths() -> JSON:
    """Pairing and the paired clients."""
    client_id = _id("client_id", "cli")
    return {
        "/v1/pairings": {
            "post": _op(
                "Make a one-time pairing code",
                {"201": _json("Pairing", "The code; a retry under the same Idempotency-Key gets it again")},
                scope="admin",
                params=(IDEMPOTENCY,),
                body="PairingRequest",
                optional_body=True,
                errors=BODY_ERRORS + ("409", "422", "503"),
            )
        },
        "/v1/pair": {
            "post": _op(
                "Redeem a pairing code for a client token",
                {
                    "201": _json(
                        "ClientToken",
                        "The new client and its token; a retry under the same Idempotency-Key gets them again",
                    )
                },
                scope=None,
                params=(IDEMPOTENCY,),
                body="PairRequest",
                errors=BODY_ERRORS + ("409", "422", "429", "503"),
            )
        },
        "/v1/clients": {"get": _op("Paired clients", {"200": _json("ClientList", "Clients")}, scope="admin")},
        "/v1/clients/{client_id}": {
            "get": _op(
                "A client", {"200": _json("Client", "The client")}, scope="admin", params=(client_id,), errors=("404",)
            ),
            "patch": _op(
                "Change a client's priority and limits (the others kept)",
                {"200": _json("Client", "The client with its new priority and limits")},
                scope="admin",
                params=(client_id,),
                body="UpdateClient",
                errors=BODY_ERRORS + ("404",),
            ),
            "delete": _op(
                "Revoke a client: its token stops working at once",
                {"200": _json("Client", "The revoked client")},
                scope="admin",
                params=(client_id,),
                errors=("404",),
            ),
        },
    }


def _model_paths() -> JSON:
    """The model registry."""
    model_id = _param("model_id", "path", STR)
    return {
        "/v1/models": {
            "get": _op("Registered models", {"200": _json("ModelList", "Models")}, scope="models:read"),
            "post": _op(
                "Register a GGUF file of the models directory",
                {"201": _json("Model", "The registered model")},
                scope="models:write",
                params=(IDEMPOTENCY,),
                body="RegisterModel",
                errors=BODY_ERRORS + ("409", "422"),
            ),
        },
        "/v1/models/{model_id}": {
            "get": _op(
                "A model",
                {"200": _json("Model", "The model")},
                scope="models:read",
                params=(model_id,),
                errors=("404",),
            ),
            "delete": _op(
                "Unregister a model (the file is left alone)",
                {"200": _json("DeletedModel", "Deleted")},
                scope="models:write",
                params=(model_id,),
                errors=("404", "409"),
            ),
        },
        "/v1/models/{model_id}/load": {
            "post": _op(
                "Load a model (its digest is checked first)",
                {"200": _json("Model", "The model")},
                scope="models:write",
                params=(model_id, IDEMPOTENCY),
                errors=("400", "404", "409", "422"),
                **NO_FIELDS,
            )
        },
        "/v1/models/{model_id}/unload": {
            "post": _op(
                "Unload a model",
                {"200": _json("Model", "The model")},
                scope="models:write",
                params=(model_id, IDEMPOTENCY),
                errors=("400", "404", "409", "422"),
                **NO_FIELDS,
            )
        },
    }


def _response_paths() -> JSON:
    """Responses and their event streams."""
    return {**_responses_path(), **_one_response_paths()}


def _responses_path() -> JSON:
    """Creating a response, and the caller's list of them."""
    return {
        "/v1/responses": {
            "post": _op(
                "Create a response: plain (200), stream (SSE) or background (202)",
                {
                    "200": {
                        "description": "The finished response, or its event stream with `stream: true`",
                        "content": {"application/json": {"schema": ref("Response")}, **SSE},
                    },
                    "202": {
                        "description": "Background: the task is committed",
                        "headers": {"Location": {"schema": STR}},
                        "content": {"application/json": {"schema": ref("Response")}},
                    },
                },
                scope="responses:write",
                params=(IDEMPOTENCY,),
                body="CreateResponse",
                errors=BODY_ERRORS + ("404", "409", "422", "429", "503"),
            ),
            "get": _op(
                "The caller's responses, newest first",
                {"200": _json("ResponseList", "A page")},
                scope="responses:read",
                params=(_param("status", "query", {"enum": RESPONSE_STATUSES}), *_list_params("resp")),
                errors=("400",),
            ),
        },
    }


def _one_response_paths() -> JSON:
    """One response: read (or follow its events), delete, cancel."""
    resp_id = _id("response_id", "resp")
    return {
        "/v1/responses/{response_id}": {
            "get": _op(
                "A response, or its events as SSE with `stream=true`",
                {
                    "200": {
                        "description": "The response or its event stream",
                        "content": {"application/json": {"schema": ref("Response")}, **SSE},
                    }
                },
                scope="responses:read",
                params=(
                    resp_id,
                    _param("stream", "query", {"type": "boolean"}),
                    _param(
                        "starting_after",
                        "query",
                        SEQUENCE,
                        "Replay the events after this sequence number, then follow.",
                    ),
                    _param("Last-Event-ID", "header", LAST_EVENT_ID, "Like `starting_after`."),
                ),
                errors=("400", "404"),
            ),
            "delete": _op(
                "Delete a finished response with its task and events",
                {"200": _json("DeletedResponse", "Deleted")},
                scope="responses:write",
                params=(resp_id,),
                errors=("404", "409"),
            ),
        },
        "/v1/responses/{response_id}/cancel": {
            "post": _op(
                "Cancel (B.7)",
                {"200": _json("Response", "The response after the cancel")},
                scope="responses:write",
                params=(resp_id, IDEMPOTENCY),
                errors=("400", "404", "409", "422"),
                **NO_FIELDS,
            )
        },
    }


def _task_paths() -> JSON:
    """Tasks and their event logs."""
    task_id = _id("task_id", "task")
    return {
        "/v1/tasks": {
            "get": _op(
                "The caller's tasks, newest first",
                {"200": _json("TaskList", "A page")},
                scope="responses:read",
                params=(_param("status", "query", {"enum": list(TASK_STATES)}), *_list_params("task")),
                errors=("400",),
            )
        },
        "/v1/tasks/{task_id}": {
            "get": _op(
                "A task", {"200": _json("Task", "The task")}, scope="responses:read", params=(task_id,), errors=("404",)
            )
        },
        "/v1/tasks/{task_id}/cancel": {
            "post": _op(
                "Cancel (B.7)",
                {"200": _json("Task", "The task after the cancel")},
                scope="responses:write",
                params=(task_id, IDEMPOTENCY),
                errors=("400", "404", "409", "422"),
                **NO_FIELDS,
            )
        },
        "/v1/tasks/{task_id}/events": {
            "get": _op(
                "The task's event log: a JSON page, or SSE with `Accept: text/event-stream`",
                {
                    "200": {
                        "description": "Events after `after`",
                        "content": {"application/json": {"schema": ref("EventList")}, **SSE},
                    }
                },
                scope="responses:read",
                params=(
                    task_id,
                    _param("after", "query", SEQUENCE | {"default": 0}),
                    _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}),
                    _param("stream", "query", {"type": "boolean"}, "SSE without the Accept header."),
                    _param("Last-Event-ID", "header", LAST_EVENT_ID, "Like `after` (SSE reconnects)."),
                ),
                errors=("400", "404"),
            )
        },
    }


def document() -> JSON:
    """A fresh copy of the OpenAPI document."""
    return copy.deepcopy(
        {
            "openapi": "3.1.0",
            "info": {
                "title": "lmsp",
                "version": lmsp.__version__,
                "description": "LMSP 1.0 local model service (see docs/API.md).",
            },
            "paths": _paths(),
            "components": {
                "schemas": SCHEMAS,
                "securitySchemes": SECURITY_SCHEMES,
            },
        }
    )
