"""The schemas of the OpenAPI document (``components``): every one comes from a wire
type of :mod:`lmsp.wire`, declared once as a Struct, save the two stream frames
that are a chunk or an error. Also the small helpers the paths are written with.

Kept true by ``tests/api/test_openapi.py``: the bodies the service refuses, the
document refuses; the answers the API tests get validate against it.
"""

from __future__ import annotations

from typing import Any, get_args

import msgspec

from lmsp.wire import answers, conversation_answers, openai_answers, service_history
from lmsp.wire.answers import OutputItem, ResponseStatus, Scopes
from lmsp.wire.chat import CreateChatCompletion, UpdateChatCompletion
from lmsp.wire.clients import UpdateClient
from lmsp.wire.completions import CreateCompletion
from lmsp.wire.conversations import AddConversationItems, CreateConversation, UpdateConversation
from lmsp.wire.embeddings import CreateEmbedding
from lmsp.wire.input import ITEMS
from lmsp.wire.models import RegisterModel
from lmsp.wire.pairing import PairingRequest, PairRequest
from lmsp.wire.responses import CreateResponse
from lmsp.wire.structs import REF, Empty, components

JSON = dict[str, Any]  # an object of the document

RESPONSE_STATUSES = list(get_args(ResponseStatus))
STR: JSON = {"type": "string"}
INT64_MAX = 2**63 - 1

REQUESTS = [
    CreateResponse,
    *ITEMS.values(),
    CreateChatCompletion,
    UpdateChatCompletion,
    CreateCompletion,
    CreateEmbedding,
    CreateConversation,
    UpdateConversation,
    AddConversationItems,
    PairingRequest,
    PairRequest,
    UpdateClient,
    RegisterModel,
    Empty,
]


def ref(name: str) -> JSON:
    return {"$ref": f"#/components/schemas/{name}"}


def text(min_length: int = 0, max_length: int | None = None, pattern: str | None = None) -> JSON:
    """A string parameter as the service takes it."""
    out: JSON = {"type": "string"}
    if min_length:
        out["minLength"] = min_length
    if max_length is not None:
        out["maxLength"] = max_length
    if pattern is not None:
        out["pattern"] = pattern
    return out


def named(aliases: dict[str, Any]) -> JSON:
    """The schemas of type aliases (a union, a list) that the document names."""
    schemas, _ = msgspec.json.schema_components(list(aliases.values()), ref_template=REF)
    return dict(zip(aliases, schemas))


SCHEMAS: JSON = {
    **components(
        [
            *REQUESTS,
            *answers.ANSWERS,
            *openai_answers.ANSWERS,
            *conversation_answers.ANSWERS,
            *service_history.ANSWERS,
        ]
    ),
    **named({"Scopes": Scopes, "OutputItem": OutputItem}),
    # a frame of a stream: a chunk, or the error that ends the stream (two objects
    # without a tag, which a Struct union cannot hold)
    "ChatCompletionStreamEvent": {"anyOf": [ref("ChatCompletionChunk"), ref("Error")]},
    "TextCompletionStreamEvent": {"anyOf": [ref("TextCompletion"), ref("Error")]},
}

SECURITY_SCHEMES = {"bearer": {"type": "http", "scheme": "bearer", "description": "A client token from pairing (B.2)."}}
