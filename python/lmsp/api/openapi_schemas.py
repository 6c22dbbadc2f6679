"""The schemas of the OpenAPI document (``components``): the objects the API takes and
answers with, and the helpers that write them.

Kept true by ``tests/api/test_openapi.py``: the bodies the API tests get validate
against these schemas.
"""

from __future__ import annotations

from typing import Any, Iterable

from lmsp.wire.conversations import AddConversationItems, CreateConversation, UpdateConversation
from lmsp.wire.embeddings import CreateEmbedding
from lmsp.wire.input import ITEMS
from lmsp.wire.responses import CreateResponse
from lmsp.wire.structs import components

from .metrics import TASK_STATES

JSON = dict[str, Any]  # an object of the document

RESPONSE_STATUSES = ["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
MODEL_STATES = ["available", "loading", "loaded", "failed", "missing", "changed"]
SCOPES = ["responses:write", "responses:read", "models:read", "models:write", "admin"]
EVENT_TYPES = [
    "response.created",
    "response.queued",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.reasoning.delta",
    "response.reasoning.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "response.cancelled",
    "task.loading",
    "task.running",
    "task.cancelling",
    "task.requeued",
    "task.resumed",
]


# a tool's or a format's name
NAME: JSON = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}


def ref(name: str) -> JSON:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: JSON) -> JSON:
    return {"anyOf": [schema, {"type": "null"}]}


def obj(properties: JSON, required: Iterable[str] | None = None, *, extra: bool = True) -> JSON:
    out: JSON = {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else list(required),
    }
    if not extra:
        out["additionalProperties"] = False
    return out


def list_of(item: str, *, paged: bool = False) -> JSON:
    props: JSON = {"object": {"const": "list"}, "data": {"type": "array", "items": ref(item)}}
    if paged:
        props.update(
            has_more={"type": "boolean"}, first_id=nullable({"type": "string"}), last_id=nullable({"type": "string"})
        )
    return obj(props)


INT = {"type": "integer"}
STR = {"type": "string"}
TIME = {"type": "integer", "description": "Unix seconds"}
INT64_MAX = 2**63 - 1


def text(min_length: int = 0, max_length: int | None = None, pattern: str | None = None) -> JSON:
    """A string field as the validators take it."""
    out: JSON = {"type": "string"}
    if min_length:
        out["minLength"] = min_length
    if max_length is not None:
        out["maxLength"] = max_length
    if pattern is not None:
        out["pattern"] = pattern
    return out


# what request fields refuse: NUL (no chat template, tokenizer or file name takes it), and in
# names shown on the operator's terminal every control character (Unicode category Cc)
NO_NUL = "^[^\\u0000]*$"
NO_CONTROL = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
MAX_TEXT = 4_000_000  # characters of one message or of the instructions
MODEL_ID = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"

SCHEMAS: JSON = {
    "Error": obj({"error": obj({"code": STR, "message": STR, "param": nullable(STR)})}),
    "Service": obj(
        {
            "service_id": STR,
            "object": {"const": "service"},
            "name": STR,
            "version": STR,
            "protocol": {"const": "LMSP/1.0"},
            "capabilities": {"type": "array", "items": STR},
            "created_at": nullable(TIME),
        }
    ),
    "Status": obj({"status": STR}),
    "Scopes": {"type": "array", "items": {"enum": SCOPES}},
    "Client": obj(
        {
            "id": STR,
            "object": {"const": "client"},
            "name": STR,
            "scopes": ref("Scopes"),
            "created_at": TIME,
            "revoked_at": nullable(TIME),
        }
    ),
    "ClientList": list_of("Client"),
    "PairingRequest": obj(
        {
            "scopes": nullable({"type": "array", "minItems": 1, "items": {"enum": SCOPES}}),
            "name": nullable(text(1, 200, NO_CONTROL)),
            "expires_in": nullable(
                {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 86400,
                    "description": "At most 86400, or `pairing_ttl_seconds` when that is larger.",
                }
            ),
        },
        [],
        extra=False,
    ),
    "Pairing": obj(
        {
            "object": {"const": "pairing"},
            "code": STR,
            "scopes": ref("Scopes"),
            "name": nullable(STR),
            "created_at": TIME,
            "expires_at": TIME,
            "id": STR,
        },
        ["object", "code", "scopes", "created_at", "expires_at"],
    ),
    "PairRequest": obj({"code": text(1, 100), "client_name": text(1, 200, NO_CONTROL)}, extra=False),
    "ClientToken": obj(
        {
            "object": {"const": "client_token"},
            "client_id": STR,
            "client_name": STR,
            "token": STR,
            "scopes": ref("Scopes"),
        }
    ),
    "Model": obj(
        {
            "id": STR,
            "object": {"const": "model"},
            "created": TIME,
            "owned_by": {"const": "local"},
            "digest": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"},
            "size_bytes": INT,
            "format": {"const": "gguf"},
            "architecture": nullable(STR),
            "parameters": nullable(INT),
            "quantization": nullable(STR),
            "context_length": nullable(INT),
            "state": {"enum": MODEL_STATES},
            "has_chat_template": {
                "type": "boolean",
                "description": "The file declares a chat template (tokenizer.chat_template): "
                "prompts are rendered with it; without one they take the plain "
                "format of docs/API.md.",
            },
            "capabilities": {
                "type": "array",
                "items": {"enum": ["generation", "embeddings"]},
                "description": "What the model does: an embedding model (an encoder) has "
                "`embeddings` only, and the generation endpoints refuse it (model_not_generative).",
            },
        }
    ),
    "ModelList": list_of("Model"),
    "RegisterModel": obj(
        {
            "path": text(1, 4096, "^[^\\u0000]*[^\\u0000\\s][^\\u0000]*$")
            | {"description": "A file under the models directory, relative to it."},
            "id": nullable(text(1, 128, MODEL_ID)),
        },
        ["path"],
        extra=False,
    ),
    "Empty": {"type": "object", "maxProperties": 0, "description": "A POST that takes no fields: no body, or `{}`."},
    "DeletedModel": obj({"id": STR, "object": {"const": "model"}, "deleted": {"const": True}}),
    "OutputText": obj({"type": {"const": "output_text"}, "text": STR, "annotations": {"type": "array"}}),
    "OutputMessage": obj(
        {
            "type": {"const": "message"},
            "id": STR,
            "role": {"const": "assistant"},
            "status": {"enum": ["in_progress", "completed", "incomplete"]},
            "content": {"type": "array", "items": ref("OutputText")},
        }
    ),
    "FunctionCall": obj(
        {
            "type": {"const": "function_call"},
            "id": {"type": "string", "pattern": "^fc_"},
            "call_id": STR,
            "name": STR,
            "arguments": STR,
            "status": {"enum": ["in_progress", "completed", "incomplete"]},
        }
    ),
    "Reasoning": obj(
        {
            "type": {"const": "reasoning"},
            "id": {"type": "string", "pattern": "^rs_"},
            "summary": {"type": "array", "maxItems": 0},
            "content": {
                "type": "array",
                "items": obj({"type": {"const": "reasoning_text"}, "text": STR}),
            },
        },
        ["type", "id", "summary"],
    ),
    "OutputItem": {"anyOf": [ref("OutputMessage"), ref("FunctionCall"), ref("Reasoning")]},
    "TaskError": nullable(obj({"code": STR, "message": STR})),
    "Response": obj(
        {
            "id": {"type": "string", "pattern": "^resp_"},
            "object": {"const": "response"},
            "created_at": TIME,
            "status": {"enum": RESPONSE_STATUSES},
            "background": {"type": "boolean"},
            "model": STR,
            "output": {"type": "array", "items": ref("OutputItem")},
            "usage": nullable(
                obj(
                    {
                        "input_tokens": INT,
                        "input_tokens_details": obj({"cached_tokens": INT, "cache_write_tokens": INT}),
                        "output_tokens": INT,
                        "output_tokens_details": obj({"reasoning_tokens": INT}),
                        "total_tokens": INT,
                    }
                )
            ),
            "error": ref("TaskError"),
            "incomplete_details": nullable(obj({"reason": STR})),
            "max_output_tokens": nullable(INT),
            "temperature": {"type": "number"},
            "top_p": {"type": "number"},
            "seed": nullable(INT),
            "metadata": {"type": "object", "additionalProperties": STR},
            "task": obj(
                {"id": STR, "status": {"enum": list(TASK_STATES)}, "on_restart": {"enum": ["fail", "retry", "resume"]}}
            ),
        }
    ),
    "ResponseList": list_of("Response", paged=True),
    "DeletedResponse": obj({"id": STR, "object": {"const": "response"}, "deleted": {"const": True}}),
    "Task": obj(
        {
            "id": {"type": "string", "pattern": "^task_"},
            "object": {"const": "task"},
            "response_id": STR,
            "status": {"enum": list(TASK_STATES)},
            "on_restart": {"enum": ["fail", "retry", "resume"]},
            "attempts": INT,
            "created_at": TIME,
            "started_at": nullable(TIME),
            "finished_at": nullable(TIME),
            "error": ref("TaskError"),
            "last_sequence_number": INT,
        }
    ),
    "TaskList": list_of("Task", paged=True),
    "Event": {
        "type": "object",
        "required": ["type", "sequence_number", "created_at"],
        "properties": {
            "type": {"enum": EVENT_TYPES},
            "sequence_number": {"type": "integer", "minimum": 1},
            "created_at": TIME,
            "response": ref("Response"),
            "task": ref("Task"),
            "delta": STR,
            "item_id": STR,
            "output_index": INT,
            "content_index": INT,
            "text": STR,
            "arguments": STR,
            "item": ref("OutputItem"),
            "part": ref("OutputText"),
        },
        # a response.failed carries its error in response.error (B.6); a top-level
        # "error" is what the openai package takes for a failed stream
        "not": {"required": ["error"]},
    },
    "EventList": obj(
        {"object": {"const": "list"}, "data": {"type": "array", "items": ref("Event")}, "has_more": {"type": "boolean"}}
    ),
}

# the schemas of the wire types (lmsp.wire), each declared once as a Struct
WIRE_SCHEMAS: JSON = components(
    [CreateEmbedding, CreateResponse, *ITEMS.values(), CreateConversation, UpdateConversation, AddConversationItems]
)

SECURITY_SCHEMES = {"bearer": {"type": "http", "scheme": "bearer", "description": "A client token from pairing (B.2)."}}
