"""A Completions request (LMSP B.11) checked, and its tasks, one per prompt: a
text or token ids, as the model takes them with no chat template; ``suffix``
for the model's fill-in-the-middle form."""

from __future__ import annotations

from typing import Any, Callable

from lmsp.contracts import CreateRequest
from lmsp.errors import InvalidRequest
from lmsp.objects import LOGPROBS

from .fields import get_bool, get_int, get_str, reject_unknown
from .input import MAX_TEXT
from .openai import ON_RESTART, include_usage, sampling_fields, token_ids
from .refusals import refuse_unsupported

REFUSED = ("n", "best_of", "presence_penalty", "frequency_penalty", "logit_bias")
ACCEPTED = (
    "model",
    "prompt",
    "suffix",
    "echo",
    "logprobs",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "user",
)
MAX_LOGPROBS = 5  # the most alternatives per token of OpenAI's legacy API


MAX_PROMPTS = 64


def prompt_params(value: Any) -> list[str]:
    """What an error about each prompt of ``prompt`` names: ``prompt`` for one prompt,
    ``prompt[i]`` for the prompts of an array of them."""
    if is_many(value):
        return [f"prompt[{i}]" for i in range(len(value))]
    return ["prompt"]


def is_many(value: Any) -> bool:
    """Whether ``prompt`` is an array of prompts (not one text or one array of token ids)."""
    return isinstance(value, list) and bool(value) and isinstance(value[0], (str, list))


def parse_prompts(value: Any) -> list[str | list[int]]:
    """``prompt``: a string, token ids, or an array of them (one completion each)."""
    if is_many(value):
        if len(value) > MAX_PROMPTS:
            raise InvalidRequest(f"'prompt' holds more than {MAX_PROMPTS} prompts", param="prompt")
        return [_one_prompt(v, param) for v, param in zip(value, prompt_params(value))]
    return [_one_prompt(value, "prompt")]


def _one_prompt(value: Any, param: str) -> str | list[int]:
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise InvalidRequest(f"{param!r} is longer than {MAX_TEXT} characters", param=param)
        if "\x00" in value:
            raise InvalidRequest(f"{param!r} must not contain NUL characters", param=param)
        return value
    if isinstance(value, list):
        return token_ids(value, param)
    raise InvalidRequest(f"{param!r} must be a string, an array of token ids, or an array of them", param=param)


def parse_completion(body: dict[str, Any], config: Any, random_seed: Callable[[], int]) -> list[CreateRequest]:
    """Check a Completions request and make its tasks, one per prompt; raises InvalidRequest."""
    reject_unknown(body, ACCEPTED + REFUSED)
    refuse_unsupported(body, REFUSED)
    model = get_str(body, "model", required=True, max_len=256)
    if body.get("prompt") is None:
        raise InvalidRequest("'prompt' is required", param="prompt")
    prompts = parse_prompts(body["prompt"])
    suffix = get_str(body, "suffix", allow_empty=True, max_len=MAX_TEXT)
    echo = get_bool(body, "echo")
    if echo and suffix is not None:
        raise InvalidRequest("'echo' cannot be used with 'suffix'", param="echo")
    stream = get_bool(body, "stream")
    if stream and len(prompts) > 1:
        raise InvalidRequest("a stream takes one prompt; send the others in requests of their own", param="stream")
    get_str(body, "user", allow_empty=True, max_len=512)
    logprobs = get_int(body, "logprobs", minimum=0, maximum=MAX_LOGPROBS)
    common = {
        "suffix": suffix,
        "echo": echo,
        # as the Responses request asks for them, which the engine and the store read
        "include": [] if logprobs is None else [LOGPROBS],
        "top_logprobs": logprobs or 0,
        **sampling_fields(body, config, random_seed),
        "stream": stream,
        "include_usage": include_usage(body, stream),
        "background": False,
        "store": False,
        "on_restart": ON_RESTART,
        "metadata": {},
    }
    return [
        CreateRequest(
            client_id=None,
            model=model,
            messages=[],
            request={"model": model, "prompt": prompt, **common},
            on_restart=ON_RESTART,
            background=False,
            stream=stream,
            store=False,
            kind="text_completion",
        )
        for prompt in prompts
    ]
