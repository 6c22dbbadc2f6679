"""An Embeddings request (LMSP B.11) checked: texts or token ids, the encoding of
the answer's vectors, and their size if asked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from msgspec import Meta

from lmsp.errors import InvalidRequest

from .input import MAX_TEXT
from .openai import token_ids
from .structs import JSON, NO_NUL, Body, ModelName, read

MAX_INPUTS = 2048
ENCODINGS = ("float", "base64")
_TEXT: JSON = {"type": "string", "minLength": 1, "maxLength": MAX_TEXT, "pattern": NO_NUL}
_TOKENS: JSON = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}


class CreateEmbedding(Body):
    """A request for embeddings: ``input`` is a text, token ids, or an array of either."""

    model: ModelName
    input: str | list[str | int | list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Meta(ge=1, description="Only the model's own size (400 otherwise).")] | None = None
    user: Annotated[str, Meta(max_length=512)] | None = None

    __schema__: ClassVar[JSON] = {
        "properties": {
            "input": {
                "anyOf": [
                    _TEXT,
                    _TOKENS,
                    {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": {"anyOf": [_TEXT, _TOKENS]}},
                ]
            }
        }
    }


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
    asked = read(body, CreateEmbedding)
    return EmbeddingRequest(asked.model, parse_input(asked.input), asked.encoding_format or "float", asked.dimensions)
