"""What OpenAI's endpoints share in a request: the sampling settings, the
stream's options, log probabilities and token ids, checked as the task keeps
them (the names of the Responses request, which the engine reads).

Their restart policy is ``fail``: the client that waits for the answer is gone
after a restart.
"""

from __future__ import annotations

from typing import Any, Callable

from lmsp.errors import InvalidRequest
from lmsp.objects import LOGPROBS

from .fields import get_bool, get_int, get_number, reject_unknown
from .input import SEED_MAX, parse_stop

ON_RESTART = "fail"
MAX_PROMPT_TOKENS = 1_000_000


def token_ids(value: list[Any], param: str) -> list[int]:
    if not value:
        raise InvalidRequest(f"{param!r} must not be an empty array of token ids", param=param)
    if len(value) > MAX_PROMPT_TOKENS:
        raise InvalidRequest(f"{param!r} has more than {MAX_PROMPT_TOKENS} token ids", param=param)
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise InvalidRequest(f"{param!r} must hold token ids: integers from 0", param=param)
    return list(value)


def _max_tokens(body: dict[str, Any], config: Any) -> int:
    given = get_int(body, "max_completion_tokens", minimum=1)
    if given is None:
        given = get_int(body, "max_tokens", minimum=1)
    return int(min(config.max_output_tokens if given is None else given, config.max_output_tokens_cap))


def include_usage(body: dict[str, Any], stream: bool) -> bool:
    """``stream_options.include_usage`` (only with ``stream``, as in OpenAI)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise InvalidRequest("'stream_options' is only allowed with 'stream': true", param="stream_options")
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    reject_unknown(options, ("include_usage", "include_obfuscation"), where="stream_options.")
    if options.get("include_obfuscation"):
        raise InvalidRequest(
            "'stream_options.include_obfuscation': this endpoint does not pad its chunks",
            param="stream_options.include_obfuscation",
        )
    return bool(get_bool(options, "include_usage", param="stream_options.include_usage"))


def sampling_fields(body: dict[str, Any], config: Any, random_seed: Callable[[], int]) -> dict[str, Any]:
    """The sampling settings that Chat Completions and Completions share, checked, as the
    task keeps them (the names of the Responses request, which the engine reads)."""
    seed = get_int(body, "seed", minimum=0, maximum=SEED_MAX)
    return {
        "max_output_tokens": _max_tokens(body, config),
        "temperature": get_number(body, "temperature", default=1.0, minimum=0, maximum=2),
        "top_p": get_number(body, "top_p", default=1.0, exclusive_minimum=0, maximum=1),
        "top_k": get_int(body, "top_k", default=0, minimum=0, maximum=2**31 - 1),  # LMSP's, as llama-server's
        "seed": random_seed() if seed is None else seed,
        "stop": parse_stop(body.get("stop")),
    }


def asked_logprobs(request: dict[str, Any]) -> bool:
    """Whether a task's request asked for log probabilities."""
    return LOGPROBS in (request.get("include") or ())
