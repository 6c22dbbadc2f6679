"""The Open Responses fields of a create request (LMSP B.11) that tune or describe
a response without being part of its prompt: declared (their wire types), and
kept in the task's request with their defaults, from which the Response object
echoes them (``lmsp.objects.echoed``).

A value that asks for nothing, or for what the service does, is accepted; one
that asks for a feature the service does not have is a 400 ``invalid_request``
naming the field, never silently ignored, its message saying why
(:func:`explained`). Tools and structured output are declared in
:mod:`lmsp.wire.tools`.
"""

from __future__ import annotations

import re
import typing
from typing import Annotated, Any, Literal

from msgspec import Meta

from lmsp.errors import InvalidRequest

from .structs import INT32_MAX, Body

# include values the service produces (a reasoning item is never encrypted: nothing to add)
Include = Literal["message.output_text.logprobs", "reasoning.encrypted_content"]
INCLUDE: tuple[str, ...] = typing.get_args(Include)
MAX_TOP_LOGPROBS = 20
MAX_KEY = 1024  # characters of prompt_cache_key, safety_identifier and user
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
Summary = Literal["auto", "concise", "detailed"]

TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)]
MaxToolCalls = Annotated[int, Meta(ge=1, le=INT32_MAX)]
Key = Annotated[str, Meta(max_length=MAX_KEY)]
Truncation = Literal["auto", "disabled"]
ServiceTier = Annotated[Literal["auto", "default"], Meta(description="The one tier of this service (auto picks it).")]
Zero = Annotated[float, Meta(ge=0, le=0, description="Only 0: penalties are not supported.")]
ContinuedId = Annotated[str, Meta(min_length=1, max_length=100)]  # previous_response_id, conversation

#: why a value its type refuses is refused, by param (each index as ``[]``): what
#: the service does not have
REASONS = {
    "include[]": f"this service can include {', '.join(INCLUDE)}",
    "service_tier": "this service has one tier (auto or default)",
    "presence_penalty": "penalties are not supported: only 0 (no penalty) is",
    "frequency_penalty": "penalties are not supported: only 0 (no penalty) is",
    "prompt": "this service has no stored prompt templates",
}


class ResponseStreamOptions(Body):
    """How a stream is sent: accepted; no obfuscation padding is sent on this service."""

    include_obfuscation: bool | None = None


class ReasoningOptions(Body):
    """The reasoning asked for: the effort is the template's thinking switch for a model
    that thinks (``generate_summary``: the older name of ``summary``)."""

    effort: Effort | None = None
    summary: Summary | None = None
    generate_summary: Summary | None = None


class ContinuedConversation(Body):
    """The conversation a response continues, by its id."""

    id: ContinuedId


_INDEX = re.compile(r"\[\d+\]")


def explained(error: InvalidRequest, reasons: dict[str, str], where: str = "") -> InvalidRequest:
    """``error`` with the reason of ``reasons`` for its param (read at ``where``), if any."""
    param = error.param or ""
    if where and param.startswith(where):
        param = param[len(where) :].lstrip(".")
    reason = reasons.get(_INDEX.sub("[]", param))
    return error if reason is None else InvalidRequest(f"{error.message}; {reason}", param=error.param)


def parse_include(value: Any) -> list[str]:
    """``include`` (of a request, or of a query): the names, each once."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest("'include' must be an array of strings", param="include")
    for i, name in enumerate(value):
        if not isinstance(name, str):
            raise InvalidRequest(f"include[{i}] must be a string", param=f"include[{i}]")
        if name not in INCLUDE:
            raise InvalidRequest(
                f"include[{i}] {name[:100]!r} is not supported; this service can include {', '.join(INCLUDE)}",
                param=f"include[{i}]",
            )
    return list(dict.fromkeys(value))


def reasoning_kept(value: ReasoningOptions | None) -> dict[str, Any] | None:
    """``reasoning`` as the task keeps it (``effort``, ``summary``): a Response echoes it
    once its output is made by a model that thinks, ``effort`` null otherwise (nothing used it)."""
    if value is None:
        return None
    return {"effort": value.effort, "summary": value.summary or value.generate_summary}
