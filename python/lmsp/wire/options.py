"""The Open Responses fields of a create request (LMSP B.11) that tune or describe
a response without being part of its prompt: checked, defaulted and kept in the
task's request, from which the Response object echoes them (``lmsp.objects.echoed``).

A value that asks for nothing, or for what the service does, is accepted; one
that asks for a feature the service does not have is a 400 ``invalid_request``
naming the field, never silently ignored. Tools and structured output are
checked in :mod:`lmsp.wire.tools`.
"""

from __future__ import annotations

from typing import Any

from lmsp.errors import InvalidRequest

from .fields import get_bool, get_int, get_number, get_str, reject_unknown

FIELDS = (
    "include",
    "top_logprobs",
    "truncation",
    "parallel_tool_calls",
    "max_tool_calls",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "reasoning",
    "previous_response_id",  # read with the context (lmsp.service.turns)
    "conversation",
    "prompt",
)
# include values the service produces (a reasoning item is never encrypted: nothing to add)
INCLUDE = ("message.output_text.logprobs", "reasoning.encrypted_content")
MAX_TOP_LOGPROBS = 20
TRUNCATIONS = ("auto", "disabled")
SERVICE_TIERS = ("auto", "default")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
REASONING_SUMMARIES = ("auto", "concise", "detailed")
MAX_KEY = 1024  # characters of prompt_cache_key, safety_identifier and user


def parse_include(value: Any) -> list[str]:
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


def _zero_penalty(body: dict[str, Any], name: str) -> float:
    value = get_number(body, name, default=0.0, minimum=-2, maximum=2)
    if value != 0:
        raise InvalidRequest(f"{name!r} is not supported: only 0 (no penalty) is", param=name)
    return 0.0


def _choice(body: dict[str, Any], name: str, choices: tuple[str, ...], default: str) -> str:
    value = get_str(body, name, default=default, max_len=64)
    if value not in choices:
        raise InvalidRequest(f"{name!r} must be one of {', '.join(choices)}", param=name)
    return str(value)


def parse_stream_options(value: Any) -> None:
    """``stream_options``: accepted; no obfuscation padding is sent on this service."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    reject_unknown(value, ("include_obfuscation",), where="stream_options.")
    get_bool(value, "include_obfuscation", param="stream_options.include_obfuscation")


def parse_reasoning(value: Any) -> dict[str, Any] | None:
    """``reasoning`` as the task keeps it (``effort``, ``summary``): the effort is the
    template's thinking switch for a model that thinks; a Response echoes it once
    its output is made by such a model, ``effort`` null otherwise (nothing used it)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest("'reasoning' must be an object", param="reasoning")
    reject_unknown(value, ("effort", "summary", "generate_summary"), where="reasoning.")
    for name, choices in (("effort", REASONING_EFFORTS), ("summary", REASONING_SUMMARIES)):
        got = value.get(name)
        if got is not None and got not in choices:
            raise InvalidRequest(f"'reasoning.{name}' must be one of {', '.join(choices)}", param=f"reasoning.{name}")
    summary = value.get("generate_summary")
    if summary is not None and summary not in REASONING_SUMMARIES:
        raise InvalidRequest(
            f"'reasoning.generate_summary' must be one of {', '.join(REASONING_SUMMARIES)}",
            param="reasoning.generate_summary",
        )
    return {"effort": value.get("effort"), "summary": value.get("summary") or summary}


def _not_yet(body: dict[str, Any], name: str, what: str) -> None:
    if body.get(name) is not None:
        raise InvalidRequest(f"{name!r} is not supported: {what}", param=name)


def parse_options(body: dict[str, Any]) -> dict[str, Any]:
    """The request's options as the task keeps them; raises InvalidRequest."""
    _not_yet(body, "prompt", "this service has no stored prompt templates")
    parse_stream_options(body.get("stream_options"))
    reasoning = parse_reasoning(body.get("reasoning"))
    tier = get_str(body, "service_tier", default="auto", max_len=64)
    if tier not in SERVICE_TIERS:
        raise InvalidRequest(
            f"'service_tier' {tier!r} is not supported: this service has one tier (auto or default)",
            param="service_tier",
        )
    return {
        "include": parse_include(body.get("include")),
        "top_logprobs": get_int(body, "top_logprobs", default=0, minimum=0, maximum=MAX_TOP_LOGPROBS),
        "truncation": _choice(body, "truncation", TRUNCATIONS, "disabled"),
        "parallel_tool_calls": get_bool(body, "parallel_tool_calls", default=True),
        "max_tool_calls": get_int(body, "max_tool_calls", minimum=1, maximum=2**31 - 1),
        "user": get_str(body, "user", max_len=MAX_KEY, allow_empty=True),
        "safety_identifier": get_str(body, "safety_identifier", max_len=MAX_KEY, allow_empty=True),
        "prompt_cache_key": get_str(body, "prompt_cache_key", max_len=MAX_KEY, allow_empty=True),
        "service_tier": "default",  # the one tier this service has, which "auto" picks
        "presence_penalty": _zero_penalty(body, "presence_penalty"),
        "frequency_penalty": _zero_penalty(body, "frequency_penalty"),
        "reasoning": reasoning,
    }
