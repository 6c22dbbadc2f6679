"""What OpenAI's endpoints share in a request: the sampling settings, the
stream's options, log probabilities and token ids, declared once
(:class:`OpenAIRequest`) and made into what the task keeps (the names of the
Responses request, which the engine reads).

Their restart policy is ``fail``: the client that waits for the answer is gone
after a restart.
"""

from __future__ import annotations

from typing import Annotated, Any, Callable, ClassVar

from msgspec import Meta

from lmsp.errors import InvalidRequest
from lmsp.objects import LOGPROBS

from .structs import INT32_MAX, JSON, Body, Seed, Stop

ON_RESTART = "fail"
MAX_PROMPT_TOKENS = 1_000_000
MAX_KEY = 512  # characters of user, safety_identifier, prompt_cache_key, service_tier

Key = Annotated[str, Meta(max_length=MAX_KEY)]
Tokens = Annotated[int, Meta(ge=1)]

#: ``stream_options`` only with ``stream: true``
STREAM_OPTIONS_NEED_STREAM: JSON = {
    "not": {
        "required": ["stream_options"],
        "properties": {"stream_options": {"type": "object"}, "stream": {"not": {"const": True}}},
    }
}


class CompletionStreamOptions(Body):
    """What a stream adds: with ``include_usage``, a last chunk with the usage."""

    include_usage: bool | None = None
    include_obfuscation: bool | None = None

    __schema__: ClassVar[JSON] = {
        "properties": {"include_obfuscation": {"anyOf": [{"const": False}, {"type": "null"}]}}
    }


class OpenAIRequest(Body):
    """The fields that Chat Completions and Completions requests share."""

    max_tokens: Tokens | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=0, le=INT32_MAX, description="LMSP's, 0: off.")] | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    stream: bool | None = None
    stream_options: CompletionStreamOptions | None = None
    user: Key | None = None
    # asked for nothing only at their default (lmsp.wire.refusals)
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None


def token_ids(value: list[Any], param: str) -> list[int]:
    if not value:
        raise InvalidRequest(f"{param!r} must not be an empty array of token ids", param=param)
    if len(value) > MAX_PROMPT_TOKENS:
        raise InvalidRequest(f"{param!r} has more than {MAX_PROMPT_TOKENS} token ids", param=param)
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise InvalidRequest(f"{param!r} must hold token ids: integers from 0", param=param)
    return list(value)


def include_usage(asked: OpenAIRequest) -> bool:
    """``stream_options.include_usage`` (only with ``stream``, as in OpenAI)."""
    options = asked.stream_options
    if options is None:
        return False
    if not asked.stream:
        raise InvalidRequest("'stream_options' is only allowed with 'stream': true", param="stream_options")
    if options.include_obfuscation:
        raise InvalidRequest(
            "'stream_options.include_obfuscation': this endpoint does not pad its chunks",
            param="stream_options.include_obfuscation",
        )
    return bool(options.include_usage)


def sampling_fields(
    asked: OpenAIRequest, config: Any, random_seed: Callable[[], int], max_tokens: int | None = None
) -> dict[str, Any]:
    """The sampling settings that Chat Completions and Completions share, as the task
    keeps them (the names of the Responses request, which the engine reads);
    ``max_tokens``: the request's cap when it has another name for it."""
    given = asked.max_tokens if max_tokens is None else max_tokens
    stop = asked.stop
    return {
        "max_output_tokens": int(
            min(config.max_output_tokens if given is None else given, config.max_output_tokens_cap)
        ),
        "temperature": 1.0 if asked.temperature is None else asked.temperature,
        "top_p": 1.0 if asked.top_p is None else asked.top_p,
        "top_k": asked.top_k or 0,
        "seed": random_seed() if asked.seed is None else asked.seed,
        "stop": [stop] if isinstance(stop, str) else list(stop or ()),
    }


def asked_logprobs(request: dict[str, Any]) -> bool:
    """Whether a task's request asked for log probabilities."""
    return LOGPROBS in (request.get("include") or ())
