"""OpenAI's Embeddings (LMSP B.11): ``POST /v1/embeddings``.

Inputs are texts or token ids; the model pools and normalizes each
(:mod:`lmsp.runtime.embeddings`), many in one pass, as a task of the store that
the request runs itself (restart policy ``fail``, deleted once answered).
"""

from __future__ import annotations

from typing import Any

import falcon

from lmsp.auth import is_admin
from lmsp.errors import InvalidRequest

from . import idempotency
from .common import Deps, caller, get_int, get_str, reject_unknown
from .completions import _token_ids
from .openai_shapes import embedding_list
from .responses import MAX_TEXT, ResponsesService

FIELDS = ("model", "input", "encoding_format", "dimensions", "user")
MAX_INPUTS = 2048
ENCODINGS = ("float", "base64")


def parse_input(value: Any) -> list[str | list[int]]:
    """``input``: a string, an array of strings, token ids, or an array of arrays of token ids."""
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        raise InvalidRequest("'input' must be a string, an array of strings or of token ids", param="input")
    if not items:
        raise InvalidRequest("'input' must not be empty", param="input")
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(f"'input' has more than {MAX_INPUTS} inputs", param="input")
    out: list[str | list[int]] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            if not item:
                raise InvalidRequest(f"input {i} is an empty string", param="input")
            if len(item) > MAX_TEXT or "\x00" in item:
                raise InvalidRequest(f"input {i} is too long or holds NUL characters", param="input")
            out.append(item)
        elif isinstance(item, list):
            out.append(_token_ids(item, "input"))
        else:
            raise InvalidRequest("each input must be a string or an array of token ids", param="input")
    return out


class EmbeddingsResource:
    """``POST /v1/embeddings``."""

    scopes = {"POST": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.service = ResponsesService(deps)

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = self.deps.body(req)
        reject_unknown(body, FIELDS)
        model = get_str(body, "model", required=True, max_len=256)
        if body.get("input") is None:
            raise InvalidRequest("'input' is required", param="input")
        inputs = parse_input(body["input"])
        encoding = get_str(body, "encoding_format", default="float")
        if encoding not in ENCODINGS:
            raise InvalidRequest(f"'encoding_format' must be one of {', '.join(ENCODINGS)}", param="encoding_format")
        dimensions = get_int(body, "dimensions", minimum=1)
        get_str(body, "user", allow_empty=True, max_len=512)
        self.service.check_serving(model)
        client = caller(req)
        cap = None if is_admin(client) else (self.deps.config.max_unfinished_per_client or None)

        def act() -> idempotency.Answer:
            result = self.deps.runtime.embed(model, inputs, client_id=client["id"], max_unfinished=cap)
            vectors = result["vectors"]
            size = len(vectors[0]) if vectors else 0
            if dimensions is not None and dimensions != size:
                raise InvalidRequest(
                    f"'dimensions' must be the model's {size}: embeddings are not shortened", param="dimensions"
                )
            return 200, embedding_list(model, vectors, int(result["prompt_tokens"]), encoding)

        # an Idempotency-Key keeps the answer for a retry (B.8)
        idempotency.answer(self.deps.store, req, resp, client["id"], body, act)
