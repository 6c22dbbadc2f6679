"""The OpenAPI schemas of Chat Completions' tool calls in answers (an answer's
``tool_calls``, a stored completion's messages); :mod:`.openapi_openai` puts them
in its answer schemas. The request's tools, response format and messages are
the wire types' (:mod:`lmsp.wire.chat_tools`, :mod:`lmsp.wire.chat`).
"""

from __future__ import annotations

from .openapi_schemas import JSON, NAME, STR, nullable, obj, text

TOOL_CALL = obj(
    {
        "id": text(1, 64),
        "type": {"const": "function"},
        "function": obj({"name": NAME, "arguments": STR}, ["name", "arguments"], extra=False),
    },
    ["id", "function"],
    extra=False,
)
TOOL_MESSAGE_FIELDS: JSON = {
    "tool_call_id": {**text(1, 64), "description": "The id of a tool call of an assistant message before it."},
}
ANSWER_TOOL_CALLS: JSON = {"type": "array", "items": TOOL_CALL}
# a stored completion's message as GET /v1/chat/completions/{id}/messages lists it
STORED_MESSAGE = obj(
    {
        "id": STR,
        "role": {"enum": ["system", "user", "assistant", "tool"]},
        "content": nullable(STR),
        "content_parts": {"type": "null"},
        "tool_calls": ANSWER_TOOL_CALLS,
        **TOOL_MESSAGE_FIELDS,
    },
    ["id", "role", "content"],
)
