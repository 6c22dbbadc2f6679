"""The schemas of the OpenAPI document (``components``): the objects the API takes and
answers with, and the helpers that write them. The answers' schemas, and more and
more of the requests', come from the wire types (``WIRE_SCHEMAS``).

Kept true by ``tests/api/test_openapi.py``: the bodies the API tests get validate
against these schemas.
"""

from __future__ import annotations

from typing import Any, Iterable, get_args

import msgspec

from lmsp.auth import Scope
from lmsp.wire import answers, conversation_answers, openai_answers
from lmsp.wire.answers import OutputItem, ResponseStatus, Scopes
from lmsp.wire.chat import CreateChatCompletion, UpdateChatCompletion
from lmsp.wire.completions import CreateCompletion
from lmsp.wire.embeddings import CreateEmbedding
from lmsp.wire.models import RegisterModel
from lmsp.wire.pairing import PairingRequest, PairRequest
from lmsp.wire.structs import REF, Empty, components

JSON = dict[str, Any]  # an object of the document

RESPONSE_STATUSES = list(get_args(ResponseStatus))
SCOPES = list(get_args(Scope))


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


STR = {"type": "string"}
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
    "InputMessage": obj(
        {
            "type": {"const": "message"},
            "role": {"enum": ["system", "developer", "user", "assistant"]},
            "content": {
                "anyOf": [
                    text(pattern=NO_NUL),
                    {
                        "type": "array",
                        "items": obj(
                            {
                                "type": {"enum": ["input_text", "output_text", "text"]},
                                "text": text(0, MAX_TEXT, NO_NUL),
                                "annotations": {"type": "array"},
                            },
                            ["type", "text"],
                            extra=False,
                        ),
                    },
                ]
            },
        },
        ["role", "content"],
        extra=False,
    ),
    "CreateResponse": obj(
        {
            "model": text(1, 256),
            "input": {
                "anyOf": [
                    text(0, MAX_TEXT, NO_NUL),
                    {"type": "array", "minItems": 1, "maxItems": 10_000, "items": ref("InputMessage")},
                ]
            },
            "instructions": nullable(text(0, MAX_TEXT, NO_NUL)),
            "max_output_tokens": nullable({"type": "integer", "minimum": 1}),
            "temperature": nullable({"type": "number", "minimum": 0, "maximum": 2}),
            "top_p": nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
            "top_k": nullable({"type": "integer", "minimum": 0, "maximum": 2**31 - 1}),
            "seed": nullable({"type": "integer", "minimum": 0, "maximum": 2**32 - 2}),
            "stop": nullable({"anyOf": [text(1, 1000), {"type": "array", "maxItems": 16, "items": text(1, 1000)}]}),
            "stream": nullable({"type": "boolean"}),
            "background": nullable({"type": "boolean"}),
            "store": nullable({"type": "boolean"}),
            "on_restart": nullable({"enum": ["fail", "retry", "resume"]}),
            "metadata": nullable(
                {
                    "type": "object",
                    "maxProperties": 16,
                    "propertyNames": text(1, 64),
                    "additionalProperties": text(0, 512),
                }
            ),
            "text": nullable(
                obj(
                    {
                        "format": nullable(
                            {
                                "anyOf": [
                                    obj({"type": {"enum": ["text", "json_object"]}}, extra=False),
                                    obj(
                                        {
                                            "type": {"const": "json_schema"},
                                            "name": NAME,
                                            "schema": {"type": "object"},
                                            "description": nullable(STR),
                                            "strict": nullable({"type": "boolean"}),
                                        },
                                        ["type", "name", "schema"],
                                        extra=False,
                                    ),
                                ]
                            }
                        ),
                        "verbosity": nullable({"const": "medium"}),
                    },
                    [],
                    extra=False,
                )
            ),
            "tools": nullable(
                {
                    "type": "array",
                    "maxItems": 128,
                    "items": obj(
                        {
                            "type": {"const": "function"},
                            "name": NAME,
                            "description": nullable(STR),
                            "parameters": nullable({"type": "object"}),
                            "strict": nullable({"type": "boolean"}),
                        },
                        ["type", "name"],
                        extra=False,
                    ),
                }
            ),
            "tool_choice": nullable(
                {
                    "anyOf": [
                        {"enum": ["auto", "none", "required"]},
                        obj({"type": {"const": "function"}, "name": NAME}, extra=False),
                    ]
                }
            ),
        },
        ["model", "input"],
        extra=False,
    )
    | {
        # a background response must be stored
        "not": {
            "required": ["background", "store"],
            "properties": {"background": {"const": True}, "store": {"const": False}},
        }
    },
}


def named(aliases: dict[str, Any]) -> JSON:
    """The schemas of type aliases (a union, a list) that the document names."""
    schemas, _ = msgspec.json.schema_components(list(aliases.values()), ref_template=REF)
    return dict(zip(aliases, schemas))


# the schemas of the wire types (lmsp.wire), each declared once as a Struct
WIRE_SCHEMAS: JSON = {
    **components(
        [
            CreateEmbedding,
            CreateChatCompletion,
            UpdateChatCompletion,
            CreateCompletion,
            PairingRequest,
            PairRequest,
            RegisterModel,
            Empty,
            *answers.ANSWERS,
            *openai_answers.ANSWERS,
            *conversation_answers.ANSWERS,
        ]
    ),
    **named({"Scopes": Scopes, "OutputItem": OutputItem}),
}

SECURITY_SCHEMES = {"bearer": {"type": "http", "scheme": "bearer", "description": "A client token from pairing (B.2)."}}
