"""The OpenAPI paths and schemas of OpenAI's endpoints (B.11): Chat
Completions, Completions and Embeddings. :mod:`.openapi` adds them to the
document; the request schemas carry what the service enforces, and a value
that asks for a feature the service lacks is left out of them.
"""

from __future__ import annotations

from typing import Callable

from .openapi_chat_tools import CHAT_MESSAGE, RESPONSE_FORMAT, TOOL_CHOICE, TOOLS
from .openapi_schemas import JSON, MAX_TEXT, NO_NUL, STR, nullable, obj, ref, text

NULL = {"type": "null"}
BOOL = nullable({"type": "boolean"})
ERROR = {"content": {"application/json": {"schema": ref("Error")}}}
SEED = nullable({"type": "integer", "minimum": 0, "maximum": 2**32 - 2})
TOKENS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
STOP = nullable({"anyOf": [text(1, 1000), {"type": "array", "maxItems": 16, "items": text(1, 1000)}]})
METADATA = nullable(
    {"type": "object", "maxProperties": 16, "propertyNames": text(1, 64), "additionalProperties": text(0, 512)}
)
METADATA_FILTER = {
    "type": "object",
    "maxProperties": 16,
    "propertyNames": text(1, 64),
    "additionalProperties": text(0, 512),
}
STREAM_OPTIONS = nullable(
    obj({"include_usage": BOOL, "include_obfuscation": nullable({"const": False})}, [], extra=False)
)
# stream_options only with stream: true
STREAM_OPTIONS_NEED_STREAM = {
    "not": {
        "required": ["stream_options"],
        "properties": {"stream_options": {"type": "object"}, "stream": {"not": {"const": True}}},
    }
}
SAMPLING: JSON = {
    "max_tokens": nullable({"type": "integer", "minimum": 1}),
    "temperature": nullable({"type": "number", "minimum": 0, "maximum": 2}),
    "top_p": nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
    "top_k": nullable({"type": "integer", "minimum": 0, "maximum": 2**31 - 1, "description": "LMSP's, 0: off."}),
    "seed": SEED,
    "stop": STOP,
    "stream": BOOL,
    "stream_options": STREAM_OPTIONS,
    "user": nullable(text(0, 512)),
}
# what asks for nothing (openai_refusals): any other value is a 400
NOTHING_ASKED: JSON = {
    "n": nullable({"const": 1}),
    "presence_penalty": nullable({"const": 0}),
    "frequency_penalty": nullable({"const": 0}),
    "logit_bias": nullable({"type": "object", "maxProperties": 0}),
}
CHAT_NOTHING_ASKED: JSON = {
    **NOTHING_ASKED,
    "functions": nullable({"type": "array", "maxItems": 0}),
    "function_call": nullable({"const": "none"}),
    "modalities": nullable({"const": ["text"]}),
    "audio": NULL,
    "prediction": NULL,
    "web_search_options": NULL,
    "reasoning_effort": NULL,
    "verbosity": NULL,
}
# top_logprobs only with logprobs: true
TOP_NEEDS_LOGPROBS = {
    "not": {
        "required": ["top_logprobs"],
        "properties": {"top_logprobs": {"type": "integer"}, "logprobs": {"not": {"const": True}}},
    }
}
SCHEMAS: JSON = {
    "CreateChatCompletion": obj(
        {
            "model": text(1, 256),
            "messages": {"type": "array", "minItems": 1, "maxItems": 10_000, "items": CHAT_MESSAGE},
            "max_completion_tokens": nullable({"type": "integer", "minimum": 1}),
            **SAMPLING,
            "safety_identifier": nullable(text(0, 512)),
            "prompt_cache_key": nullable(text(0, 512)),
            "service_tier": nullable(text(0, 512)),
            "metadata": METADATA,
            "store": BOOL,
            "logprobs": BOOL,
            "top_logprobs": nullable({"type": "integer", "minimum": 0, "maximum": 20}),
            "tools": TOOLS,
            "tool_choice": TOOL_CHOICE,
            "parallel_tool_calls": BOOL,
            "response_format": RESPONSE_FORMAT,
            **CHAT_NOTHING_ASKED,
        },
        ["model", "messages"],
        extra=False,
    )
    | {"allOf": [STREAM_OPTIONS_NEED_STREAM, TOP_NEEDS_LOGPROBS]},
    "UpdateChatCompletion": obj({"metadata": METADATA}, ["metadata"], extra=False),
    "CreateCompletion": obj(
        {
            "model": text(1, 256),
            "prompt": {
                "anyOf": [
                    text(0, MAX_TEXT, NO_NUL),
                    TOKENS,
                    {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 64,
                        "items": {"anyOf": [text(0, MAX_TEXT, NO_NUL), TOKENS]},
                        "description": "A completion per prompt, each a choice (not with `stream`).",
                    },
                ]
            },
            "suffix": nullable(text(0, MAX_TEXT, NO_NUL)),
            "echo": BOOL,
            **SAMPLING,
            **NOTHING_ASKED,
            "best_of": nullable({"const": 1}),
            "logprobs": nullable({"type": "integer", "minimum": 0, "maximum": 5}),
        },
        ["model", "prompt"],
        extra=False,
    )
    | {
        "allOf": [
            STREAM_OPTIONS_NEED_STREAM,
            # a stream of one prompt only
            {
                "not": {
                    "required": ["stream", "prompt"],
                    "properties": {
                        "stream": {"const": True},
                        "prompt": {"type": "array", "minItems": 2, "items": {"type": ["string", "array"]}},
                    },
                }
            },
            # echo: without suffix
            {"not": {"required": ["echo", "suffix"], "properties": {"echo": {"const": True}, "suffix": STR}}},
        ]
    },
    # a frame of a stream: a chunk, or the error that ends the stream
    "ChatCompletionStreamEvent": {"anyOf": [ref("ChatCompletionChunk"), ref("Error")]},
    "TextCompletionStreamEvent": {"anyOf": [ref("TextCompletion"), ref("Error")]},
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
    "429": "rate_limited (with Retry-After)",
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
