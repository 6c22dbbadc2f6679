"""OpenAI's Embeddings (LMSP B.11): ``POST /v1/embeddings``.

Inputs are texts or token ids (:mod:`lmsp.wire.embeddings`); the model pools and
normalizes each (:mod:`lmsp.runtime.embeddings`), many in one pass, as a task of
the store that the request runs itself (restart policy ``fail``, deleted once
answered).
"""

from __future__ import annotations

import falcon

from lmsp.errors import InvalidRequest
from lmsp.service.keys import Answer
from lmsp.wire.embeddings import parse_embeddings

from . import idempotency
from .common import Deps, request_caller
from .openai_shapes import embedding_list


class EmbeddingsResource:
    """``POST /v1/embeddings``."""

    scopes = {"POST": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = self.deps.body(req)
        asked = parse_embeddings(body)
        who = request_caller(req)
        tasks = self.deps.tasks

        def act() -> Answer:
            result = tasks.embed(who, asked.model, asked.inputs)
            vectors = result["vectors"]
            size = len(vectors[0]) if vectors else 0
            if asked.dimensions is not None and asked.dimensions != size:
                raise InvalidRequest(
                    f"'dimensions' must be the model's {size}: embeddings are not shortened", param="dimensions"
                )
            return 200, embedding_list(asked.model, vectors, int(result["prompt_tokens"]), asked.encoding)

        tasks.check_serving(asked.model)
        # an Idempotency-Key keeps the answer for a retry (B.8)
        idempotency.answer(self.deps.keys, req, resp, who.client_id, body, act)
