"""An Embeddings request (LMSP B.11) checked: texts or token ids, the encoding of
the answer's vectors, and their size if asked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmsp.errors import InvalidRequest

from .fields import get_int, get_str, reject_unknown
from .input import MAX_TEXT
from .openai import token_ids

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
            out.append(token_ids(item, "input"))
        else:
            raise InvalidRequest("each input must be a string or an array of token ids", param="input")
    return out


@dataclass(frozen=True)
class EmbeddingRequest:
    """``dimensions``: the vectors' size the client expects (None: the model's)."""

    model: str
    inputs: list[str | list[int]]
    encoding: str
    dimensions: int | None


def parse_embeddings(body: dict[str, Any]) -> EmbeddingRequest:
    """Check an Embeddings request; raises InvalidRequest."""
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
    return EmbeddingRequest(model, inputs, encoding, dimensions)
