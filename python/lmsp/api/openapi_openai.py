"""The OpenAPI paths of OpenAI's endpoints (B.11): Chat Completions, Completions
and Embeddings. :mod:`.openapi` adds them to the document. Their bodies'
schemas are the wire types' (:mod:`lmsp.wire.chat`, :mod:`lmsp.wire.completions`,
:mod:`lmsp.wire.embeddings`, :mod:`lmsp.wire.openai_answers`).
"""

from __future__ import annotations

from typing import Callable

from .openapi_schemas import JSON, STR, ref, text

ERROR = {"content": {"application/json": {"schema": ref("Error")}}}
METADATA_FILTER = {
    "type": "object",
    "maxProperties": 16,
    "propertyNames": text(1, 64),
    "additionalProperties": text(0, 512),
}


def _sse(chunk: str) -> JSON:
    return {
        "text/event-stream": {
            "schema": {
                "type": "string",
                "description": "Frames `data: <chunk JSON>`, blank line; `data: [DONE]` after the last chunk. "
                'An error ends the stream as `data: {"error": {...}}`.',
            },
            "x-event-schema": ref(chunk),
        }
    }


def _errors(errors: dict[str, str]) -> JSON:
    return {status: {"description": why, **ERROR} for status, why in errors.items()}


TASK_ERRORS = {
    "400": "invalid_request, invalid_json, context_length_exceeded or model_not_generative "
    "(also a task that failed for its prompt)",
    "404": "not_found: the model",
    "408": "request_timeout",
    "409": "idempotency_key_in_use, model_changed, or `cancelled` (the task was cancelled)",
    "413": "payload_too_large",
    "415": "unsupported_media_type",
    "422": "idempotency_key_reused",
    "429": "rate_limited or quota_exceeded (with Retry-After)",
    "500": "the task failed (its error code, such as model_load_failed)",
}


Maker = Callable[..., JSON]


def paths(op: Maker, param: Maker, idempotency: JSON, body_errors: tuple[str, ...]) -> JSON:
    """The paths, made with :mod:`.openapi`'s helpers (``op``: its ``_op``, ``param``: its ``_param``)."""
    return {
        **_chat_paths(op, param, idempotency),
        **_stored_chat_paths(op, param, idempotency, body_errors),
        **_other_paths(op, idempotency, body_errors),
    }


def _chat_paths(op: Maker, param: Maker, idempotency: JSON) -> JSON:
    create = {"scope": "responses:write", "params": (idempotency,)}
    return {
        "/v1/chat/completions": {
            "post": op(
                "Create a chat completion (a task of the store; streamed with `stream: true`)",
                {
                    "200": {
                        "description": "The chat completion, or its chunks with `stream: true`",
                        "content": {
                            "application/json": {"schema": ref("ChatCompletion")},
                            **_sse("ChatCompletionStreamEvent"),
                        },
                    },
                    **_errors(TASK_ERRORS),
                },
                body="CreateChatCompletion",
                **create,
            ),
            "get": op(
                "The caller's stored chat completions (oldest first unless `order=desc`)",
                {
                    "200": {
                        "description": "A page",
                        "content": {"application/json": {"schema": ref("ChatCompletionList")}},
                    }
                },
                scope="responses:read",
                params=(
                    param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}),
                    param("after", "query", text(0, 100, "^chatcmpl-"), "The last id of the previous page."),
                    param("order", "query", {"enum": ["asc", "desc"]}),
                    param("model", "query", STR),
                    param(
                        "metadata",
                        "query",
                        METADATA_FILTER,
                        "`metadata[key]=value`: only those whose metadata has each pair.",
                    )
                    | {"style": "deepObject", "explode": True},
                ),
                errors=("400",),
            ),
        },
    }


def _stored_chat_paths(op: Maker, param: Maker, idempotency: JSON, body_errors: tuple[str, ...]) -> JSON:
    chat_id = param("completion_id", "path", text(0, 100, "^chatcmpl-"), "An id starting with `chatcmpl-`.")
    return {
        "/v1/chat/completions/{completion_id}": {
            "get": op(
                "A stored chat completion",
                {"200": {"description": "It", "content": {"application/json": {"schema": ref("ChatCompletion")}}}},
                scope="responses:read",
                params=(chat_id,),
                errors=("404",),
            ),
            "post": op(
                "Update a stored chat completion: its `metadata`, replaced (OpenAI's update)",
                {"200": {"description": "It", "content": {"application/json": {"schema": ref("ChatCompletion")}}}},
                scope="responses:write",
                params=(chat_id, idempotency),
                body="UpdateChatCompletion",
                errors=body_errors + ("404", "409", "422"),  # 409, 422: its Idempotency-Key
            ),
            "delete": op(
                "Delete a finished stored chat completion",
                {
                    "200": {
                        "description": "Deleted",
                        "content": {"application/json": {"schema": ref("DeletedChatCompletion")}},
                    }
                },
                scope="responses:write",
                params=(chat_id,),
                errors=("404", "409"),
            ),
        },
        "/v1/chat/completions/{completion_id}/messages": {
            "get": op(
                "A stored chat completion's messages (oldest first unless `order=desc`)",
                {
                    "200": {
                        "description": "A page",
                        "content": {"application/json": {"schema": ref("ChatCompletionMessageList")}},
                    }
                },
                scope="responses:read",
                params=(
                    chat_id,
                    param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}),
                    param("after", "query", STR, "The last id of the previous page."),
                    param("order", "query", {"enum": ["asc", "desc"]}),
                ),
                errors=("400", "404"),
            ),
        },
    }


def _other_paths(op: Maker, idempotency: JSON, body_errors: tuple[str, ...]) -> JSON:
    create = {"scope": "responses:write", "params": (idempotency,)}
    return {
        "/v1/completions": {
            "post": op(
                "Create a text completion of a raw prompt (no chat template; a task of the store)",
                {
                    "200": {
                        "description": "The completion, or its chunks with `stream: true`",
                        "content": {
                            "application/json": {"schema": ref("TextCompletion")},
                            **_sse("TextCompletionStreamEvent"),
                        },
                    },
                    **_errors(TASK_ERRORS),
                },
                body="CreateCompletion",
                **create,
            ),
        },
        "/v1/embeddings": {
            "post": op(
                "Embeddings of texts or token ids (pooled, normalized)",
                {
                    "200": {
                        "description": "The embeddings",
                        "content": {"application/json": {"schema": ref("EmbeddingList")}},
                    }
                },
                scope="responses:write",
                params=(idempotency,),
                body="CreateEmbedding",
                errors=body_errors + ("404", "409", "422", "429"),
            ),
        },
    }
