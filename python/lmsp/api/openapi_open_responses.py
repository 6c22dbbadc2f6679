"""The OpenAPI schemas of the Open Responses fields (LMSP B.11) that the Response
object echoes (what a create request may set is its wire type's:
lmsp.wire.responses)."""

from __future__ import annotations

import copy

from .openapi_schemas import JSON, STR, nullable, obj

LOGPROB_ENTRY = obj(
    {"token": STR, "logprob": {"type": "number"}, "bytes": {"type": "array", "items": {"type": "integer"}}}
)
LOGPROB = obj(
    {
        "token": STR,
        "logprob": {"type": "number"},
        "bytes": {"type": "array", "items": {"type": "integer"}},
        "top_logprobs": {"type": "array", "items": LOGPROB_ENTRY},
    }
)
LOGPROBS = {"type": "array", "items": LOGPROB}
NULL = {"type": "null"}

# what the Response object echoes
RESPONSE: JSON = {
    "completed_at": nullable({"type": "integer"}),
    "previous_response_id": NULL,
    "instructions": nullable(STR),
    "tools": {"type": "array"},
    "tool_choice": {"anyOf": [{"enum": ["auto", "none", "required"]}, {"type": "object"}]},
    "truncation": {"enum": ["auto", "disabled"]},
    "parallel_tool_calls": {"type": "boolean"},
    "text": obj(
        {"format": obj({"type": {"enum": ["text", "json_object", "json_schema"]}}), "verbosity": nullable(STR)}
    ),
    "presence_penalty": {"type": "number"},
    "frequency_penalty": {"type": "number"},
    "top_logprobs": {"type": "integer"},
    "reasoning": nullable(obj({"effort": nullable(STR), "summary": nullable(STR)})),
    "max_tool_calls": nullable({"type": "integer"}),
    "store": {"type": "boolean"},
    "service_tier": STR,
    "safety_identifier": nullable(STR),
    "prompt_cache_key": nullable(STR),
    "user": nullable(STR),
}


def extended(schemas: JSON) -> JSON:
    """``schemas`` (openapi_schemas.SCHEMAS, left as it is) with the Open Responses fields."""
    out = copy.deepcopy(schemas)
    out["Response"]["properties"].update(RESPONSE)
    out["Response"]["required"] = list(out["Response"]["properties"])
    out["OutputText"]["properties"]["logprobs"] = LOGPROBS
    out["Event"]["properties"]["logprobs"] = LOGPROBS
    return out
