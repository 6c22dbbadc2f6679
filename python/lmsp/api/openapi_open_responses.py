"""The OpenAPI schemas of the Open Responses fields (LMSP B.11): what a create request
may set (the values the service accepts: see lmsp.wire.options; tools and
text.format are in openapi_schemas.py), and the input items and content parts as
the SDKs send them back. What the Response object echoes is in lmsp.wire.answers."""

from __future__ import annotations

import copy

from .openapi_schemas import JSON, MAX_TEXT, NO_NUL, STR, nullable, obj, ref, text

REASONING_EFFORTS = ["none", "minimal", "low", "medium", "high", "xhigh"]
REASONING_SUMMARIES = ["auto", "concise", "detailed"]
ZERO = {"type": "number", "minimum": 0, "maximum": 0, "description": "Only 0: penalties are not supported."}
NULL = {"type": "null"}

# the request's fields, as accepted
REQUEST: JSON = {
    "include": nullable(
        {"type": "array", "items": {"enum": ["message.output_text.logprobs", "reasoning.encrypted_content"]}}
    ),
    "top_logprobs": nullable({"type": "integer", "minimum": 0, "maximum": 20}),
    "truncation": nullable({"enum": ["auto", "disabled"]}),
    "parallel_tool_calls": nullable({"type": "boolean"}),
    "max_tool_calls": nullable({"type": "integer", "minimum": 1, "maximum": 2**31 - 1}),
    "user": nullable(text(0, 1024)),
    "safety_identifier": nullable(text(0, 1024)),
    "prompt_cache_key": nullable(text(0, 1024)),
    "service_tier": nullable({"enum": ["auto", "default"]}),
    "stream_options": nullable(obj({"include_obfuscation": nullable({"type": "boolean"})}, [], extra=False)),
    "presence_penalty": nullable(ZERO),
    "frequency_penalty": nullable(ZERO),
    "reasoning": nullable(
        obj(
            {
                "effort": nullable({"enum": REASONING_EFFORTS}),
                "summary": nullable({"enum": REASONING_SUMMARIES}),
                "generate_summary": nullable({"enum": REASONING_SUMMARIES}),
            },
            [],
            extra=False,
        )
    ),
    "previous_response_id": NULL,
    "conversation": NULL,
    "prompt": NULL,
}

# a content part of an input message: text (an output's annotations and logprobs
# as the SDKs echo them), or an assistant's refusal
INPUT_PART: JSON = {
    "anyOf": [
        obj(
            {
                "type": {"enum": ["input_text", "output_text", "text"]},
                "text": text(0, MAX_TEXT, NO_NUL),
                "annotations": {"type": "array"},
                "logprobs": nullable({"type": "array"}),
            },
            ["type", "text"],
            extra=False,
        ),
        obj({"type": {"const": "refusal"}, "refusal": text(0, MAX_TEXT, NO_NUL)}, extra=False),
    ]
}
# fields of an input message that the SDKs echo from an output message
MESSAGE_ECHO: JSON = {"id": nullable(text(0, 256)), "status": nullable(STR), "phase": nullable(STR)}
# a reasoning item of an earlier output: accepted, and not part of the prompt
REASONING_ITEM = obj(
    {
        "type": {"const": "reasoning"},
        "id": nullable(STR),
        "summary": nullable({"type": "array"}),
        "content": nullable({"type": "array"}),
        "encrypted_content": nullable(STR),
        "status": nullable(STR),
    },
    ["type"],
    extra=False,
)


def extended(schemas: JSON) -> JSON:
    """``schemas`` (openapi_schemas.SCHEMAS, left as it is) with the Open Responses fields."""
    out = copy.deepcopy(schemas)
    create = out["CreateResponse"]
    create["properties"].update(REQUEST)
    messages = create["properties"]["input"]["anyOf"][1]
    messages["items"] = {"anyOf": [messages["items"], REASONING_ITEM]}
    messages["contains"] = ref("InputMessage")  # a reasoning item alone makes no prompt
    message = out["InputMessage"]
    message["properties"].update(MESSAGE_ECHO)
    message["properties"]["content"]["anyOf"][1]["items"] = INPUT_PART
    return out
