"""A Completions request (LMSP B.11) checked, and its tasks, one per prompt: a
text or token ids, as the model takes them with no chat template; ``suffix``
for the model's fill-in-the-middle form."""

from __future__ import annotations

from typing import Annotated, Any, Callable, ClassVar

from msgspec import Meta

from lmsp.contracts import CreateRequest
from lmsp.errors import InvalidRequest
from lmsp.objects import LOGPROBS

from .input import MAX_TEXT
from .openai import (
    ON_RESTART,
    STREAM_OPTIONS_NEED_STREAM,
    OpenAIRequest,
    include_usage,
    sampling_fields,
    token_ids,
)
from .refusals import nothing_asked, refuse_unsupported
from .structs import JSON, NO_NUL, ModelName, read

REFUSED = ("n", "best_of", "presence_penalty", "frequency_penalty", "logit_bias")
MAX_LOGPROBS = 5  # the most alternatives per token of OpenAI's legacy API
MAX_PROMPTS = 64
_TEXT: JSON = {"type": "string", "maxLength": MAX_TEXT, "pattern": NO_NUL}
_TOKENS: JSON = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}


class CreateCompletion(OpenAIRequest, kw_only=True):
    """A completion of a raw prompt (no chat template; a task of the store): ``prompt`` is
    a text, token ids, or an array of either (a completion each)."""

    model: ModelName
    prompt: str | list[Any]
    suffix: Annotated[str, Meta(max_length=MAX_TEXT, pattern=NO_NUL)] | None = None
    echo: bool | None = None
    logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None
    best_of: int | None = None  # asked for nothing only at 1 (lmsp.wire.refusals)

    __schema__: ClassVar[JSON] = {
        "properties": {
            "prompt": {
                "anyOf": [
                    _TEXT,
                    _TOKENS,
                    {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": MAX_PROMPTS,
                        "items": {"anyOf": [_TEXT, _TOKENS]},
                        "description": "A completion per prompt, each a choice (not with `stream`).",
                    },
                ]
            },
            **nothing_asked(REFUSED),
        },
        "allOf": [
            STREAM_OPTIONS_NEED_STREAM,
            # a stream of one prompt only
            {
                "not": {
                    "required": ["stream", "prompt"],
                    "properties": {
                        "stream": {"const": True},
                        "prompt": {"type": "array", "minItems": 2, "items": {"type": ["string", "array"]}},
                    },
                }
            },
            # echo: without suffix
            {
                "not": {
                    "required": ["echo", "suffix"],
                    "properties": {"echo": {"const": True}, "suffix": {"type": "string"}},
                }
            },
        ],
    }


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
    asked = read(body, CreateCompletion)
    refuse_unsupported(asked, REFUSED)
    prompts = parse_prompts(asked.prompt)
    suffix, echo, stream = asked.suffix, bool(asked.echo), bool(asked.stream)
    if echo and suffix is not None:
        raise InvalidRequest("'echo' cannot be used with 'suffix'", param="echo")
    if stream and len(prompts) > 1:
        raise InvalidRequest("a stream takes one prompt; send the others in requests of their own", param="stream")
    logprobs, model = asked.logprobs, asked.model
    common = {
        "suffix": suffix,
        "echo": echo,
        # as the Responses request asks for them, which the engine and the store read
        "include": [] if logprobs is None else [LOGPROBS],
        "top_logprobs": logprobs or 0,
        **sampling_fields(asked, config, random_seed),
        "stream": stream,
        "include_usage": include_usage(asked),
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
