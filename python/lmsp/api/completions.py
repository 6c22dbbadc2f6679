"""OpenAI's Completions (LMSP B.11): ``POST /v1/completions``, the endpoint for
base models. The prompt goes to the model as it is, with no chat template: a
text (tokenized with the model's BOS, special-token text parsed, as
llama-server does) or token ids (as given). With ``suffix`` the prompt is the
model's fill-in-the-middle form. The request is a task of the store, like a
chat completion (:mod:`lmsp.api.openai_tasks`), never stored past its answer.
"""

from __future__ import annotations

from typing import Any, Callable

import falcon

from lmsp.errors import InvalidRequest

from .chat import include_usage, sampling_fields
from .common import Deps, get_bool, get_str, reject_unknown
from .openai_refusals import refuse_unsupported
from .openai_shapes import ChunkFraming, text_completion
from .openai_tasks import ON_RESTART, post_task
from .responses import MAX_TEXT, CreateRequest, ResponsesService

REFUSED = ("n", "best_of", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs")
ACCEPTED = (
    "model",
    "prompt",
    "suffix",
    "echo",
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
MAX_PROMPT_TOKENS = 1_000_000


def _token_ids(value: list[Any], param: str) -> list[int]:
    if not value:
        raise InvalidRequest(f"{param!r} must not be an empty array of token ids", param=param)
    if len(value) > MAX_PROMPT_TOKENS:
        raise InvalidRequest(f"{param!r} has more than {MAX_PROMPT_TOKENS} token ids", param=param)
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise InvalidRequest(f"{param!r} must hold token ids: integers from 0", param=param)
    return list(value)


def parse_prompt(value: Any) -> str | list[int]:
    """``prompt``: a string, token ids, or an array of one of them (one prompt per request)."""
    if isinstance(value, list) and value and isinstance(value[0], (str, list)):
        if len(value) != 1:
            raise InvalidRequest(
                "'prompt' must hold one prompt: this endpoint makes one completion per request", param="prompt"
            )
        value = value[0]
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise InvalidRequest(f"'prompt' is longer than {MAX_TEXT} characters", param="prompt")
        if "\x00" in value:
            raise InvalidRequest("'prompt' must not contain NUL characters", param="prompt")
        return value
    if isinstance(value, list):
        return _token_ids(value, "prompt")
    raise InvalidRequest("'prompt' must be a string, an array of token ids, or an array of one of them", param="prompt")


def parse_completion(body: dict[str, Any], config: Any, random_seed: Callable[[], int]) -> CreateRequest:
    """Check a Completions request and make its task; raises InvalidRequest."""
    reject_unknown(body, ACCEPTED + REFUSED)
    refuse_unsupported(body, REFUSED)
    model = get_str(body, "model", required=True, max_len=256)
    if body.get("prompt") is None:
        raise InvalidRequest("'prompt' is required", param="prompt")
    prompt = parse_prompt(body["prompt"])
    suffix = get_str(body, "suffix", allow_empty=True, max_len=MAX_TEXT)
    echo = get_bool(body, "echo")
    if echo and not isinstance(prompt, str):
        raise InvalidRequest("'echo' needs a text prompt (not token ids)", param="echo")
    if echo and suffix is not None:
        raise InvalidRequest("'echo' cannot be used with 'suffix'", param="echo")
    stream = get_bool(body, "stream")
    get_str(body, "user", allow_empty=True, max_len=512)
    request = {
        "model": model,
        "prompt": prompt,
        "suffix": suffix,
        "echo": echo,
        **sampling_fields(body, config, random_seed),
        "stream": stream,
        "include_usage": include_usage(body, stream),
        "background": False,
        "store": False,
        "on_restart": ON_RESTART,
        "metadata": {},
    }
    return CreateRequest(
        client_id=None,
        model=model,
        messages=[],
        request=request,
        on_restart=ON_RESTART,
        background=False,
        stream=stream,
        store=False,
        kind="text_completion",
    )


class CompletionsResource:
    """``POST /v1/completions``."""

    scopes = {"POST": "responses:write"}

    def __init__(self, deps: Deps, service: ResponsesService) -> None:
        self.deps = deps
        self.service = service

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        deps = self.deps
        body = deps.body(req)
        parsed = parse_completion(body, deps.config, deps.random_seed)
        echo = parsed.request["prompt"] if parsed.request["echo"] else ""
        usage = bool(parsed.request["include_usage"])
        post_task(
            deps,
            self.service,
            req,
            resp,
            body,
            parsed,
            lambda response: text_completion(response, echo),
            lambda created: ChunkFraming("text_completion", created, include_usage=usage, echo=echo),
        )
