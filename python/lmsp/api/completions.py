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
from lmsp.objects import LOGPROBS

from .chat import asked_logprobs, include_usage, sampling_fields
from . import idempotency
from .common import Deps, get_bool, get_int, get_str, reject_unknown, set_json
from .openai_refusals import refuse_unsupported
from .openai_shapes import ChunkFraming, text_completion
from .openai_tasks import ON_RESTART, post_task, post_together
from .responses import MAX_TEXT, CreateRequest, ResponsesService

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
MAX_PROMPT_TOKENS = 1_000_000
MAX_LOGPROBS = 5  # the most alternatives per token of OpenAI's legacy API


def _token_ids(value: list[Any], param: str) -> list[int]:
    if not value:
        raise InvalidRequest(f"{param!r} must not be an empty array of token ids", param=param)
    if len(value) > MAX_PROMPT_TOKENS:
        raise InvalidRequest(f"{param!r} has more than {MAX_PROMPT_TOKENS} token ids", param=param)
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise InvalidRequest(f"{param!r} must hold token ids: integers from 0", param=param)
    return list(value)


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
        return _token_ids(value, param)
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


class CompletionsResource:
    """``POST /v1/completions``."""

    scopes = {"POST": "responses:write"}

    def __init__(self, deps: Deps, service: ResponsesService) -> None:
        self.deps = deps
        self.service = service

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        deps = self.deps
        body = deps.body(req)
        every = parse_completion(body, deps.config, deps.random_seed)
        for parsed, param in zip(every, prompt_params(body["prompt"])):
            self._check_not_empty(parsed.request, param)
        echoes = [self._echo(p.request) for p in every]
        logprobs = asked_logprobs(every[0].request)
        pieces = [self._pieces(p.request) if logprobs else () for p in every]
        if len(every) > 1:
            if idempotency.key_of(req) is not None:
                raise InvalidRequest(
                    "an Idempotency-Key names one task: send one prompt per request", param="Idempotency-Key"
                )
            finals = post_together(deps, self.service, req, every)
            set_json(
                resp,
                merged([text_completion(f, e, logprobs, p) for f, e, p in zip(finals, echoes, pieces)]),
            )
            return
        usage = bool(every[0].request["include_usage"])
        post_task(
            deps,
            self.service,
            req,
            resp,
            body,
            every[0],
            lambda response: text_completion(response, echoes[0], logprobs, pieces[0]),
            lambda created: ChunkFraming(
                "text_completion",
                created,
                include_usage=usage,
                echo=echoes[0],
                logprobs=logprobs,
                echo_pieces=pieces[0],
            ),
        )

    def _check_not_empty(self, request: dict[str, Any], param: str) -> None:
        """An empty text is a prompt only for a model that adds a BOS token to a text;
        for another it has no token, and it is refused naming ``param`` before any task
        exists (the only text without tokens: any other has at least one)."""
        if request["prompt"] != "" or request["suffix"] is not None:
            return
        self.service.check_serving(request["model"])  # a model it cannot be: refused as a task is
        if not self.deps.runtime.prompt_pieces(request["model"], ""):
            raise InvalidRequest(
                f"{param!r} is empty and model {request['model']} adds no BOS token: the prompt has no tokens",
                param=param,
            )

    def _pieces(self, request: dict[str, Any]) -> tuple[bytes, ...]:
        """The bytes of each of the prompt's tokens that ``echo`` shows (none without it)."""
        if not request["echo"]:
            return ()
        return tuple(self.deps.runtime.prompt_pieces(request["model"], request["prompt"]))

    def _echo(self, request: dict[str, Any]) -> str:
        """The text ``echo`` puts in front of the output: the prompt, its token ids as text."""
        if not request["echo"]:
            return ""
        prompt = request["prompt"]
        if isinstance(prompt, str):
            return prompt
        text: str = self.deps.runtime.detokenize(request["model"], prompt)
        return text


def merged(completions: list[dict[str, Any]]) -> dict[str, Any]:
    """One text_completion of many prompts' (the first one's id): a choice per prompt, in
    order, and the usage summed."""
    out = dict(completions[0])
    out["choices"] = [dict(c["choices"][0], index=i) for i, c in enumerate(completions)]
    if all(c["usage"] for c in completions):
        usage = {k: sum(c["usage"][k] for c in completions) for k in ("prompt_tokens", "completion_tokens")}
        cached = sum(c["usage"]["prompt_tokens_details"]["cached_tokens"] for c in completions)
        out["usage"] = dict(
            completions[0]["usage"],
            **usage,
            total_tokens=usage["prompt_tokens"] + usage["completion_tokens"],
            prompt_tokens_details={"cached_tokens": cached, "audio_tokens": 0},
        )
    return out
