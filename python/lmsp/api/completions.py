"""OpenAI's Completions (LMSP B.11): ``POST /v1/completions``, the endpoint for
base models. The prompt goes to the model as it is, with no chat template: a
text (tokenized with the model's BOS, special-token text parsed, as
llama-server does) or token ids (as given). With ``suffix`` the prompt is the
model's fill-in-the-middle form. The request is a task of the store, like a
chat completion, never stored past its answer (:mod:`lmsp.wire.completions`
parses it).
"""

from __future__ import annotations

from typing import Any

import falcon

from lmsp.errors import InvalidRequest
from lmsp.wire.completions import parse_completion, prompt_params
from lmsp.wire.openai import asked_logprobs

from . import idempotency, openai_answers
from .common import Deps, request_caller, set_json
from .openai_shapes import ChunkFraming, text_completion


class CompletionsResource:
    """``POST /v1/completions``."""

    scopes = {"POST": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        deps = self.deps
        body = deps.body(req)
        every = parse_completion(body, deps.config, deps.random_seed)
        for parsed, param in zip(every, prompt_params(body["prompt"])):
            self._check_not_empty(parsed.request, param)
        echoes = [self._echo(p.request) for p in every]
        logprobs = asked_logprobs(every[0].request)
        pieces = [self._pieces(p.request) if logprobs else () for p in every]
        who = request_caller(req)
        if len(every) > 1:
            if idempotency.key_of(req) is not None:
                raise InvalidRequest(
                    "an Idempotency-Key names one task: send one prompt per request", param="Idempotency-Key"
                )
            finals = openai_answers.finals(deps.tasks.submit_together(who, every))
            set_json(
                resp,
                merged([text_completion(f, e, logprobs, p) for f, e, p in zip(finals, echoes, pieces)]),
            )
            return
        usage = bool(every[0].request["include_usage"])

        def framing(created: dict[str, Any]) -> ChunkFraming:
            return ChunkFraming(
                "text_completion",
                created,
                include_usage=usage,
                echo=echoes[0],
                logprobs=logprobs,
                echo_pieces=pieces[0],
            )

        key = idempotency.create_key(req, who.client_id, body)
        delivery = deps.tasks.submit(who, every[0], key, framing)
        openai_answers.write(resp, delivery, lambda response: text_completion(response, echoes[0], logprobs, pieces[0]))

    def _check_not_empty(self, request: dict[str, Any], param: str) -> None:
        """An empty text is a prompt only for a model that adds a BOS token to a text;
        for another it has no token, and it is refused naming ``param`` before any task
        exists (the only text without tokens: any other has at least one)."""
        if request["prompt"] != "" or request["suffix"] is not None:
            return
        self.deps.tasks.check_serving(request["model"])  # a model it cannot be: refused as a task is
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
