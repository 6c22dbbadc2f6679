"""A model file registered (``POST /v1/models``, LMSP B.4): its path under the
models directory and the id it is served as."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from msgspec import Meta

from .structs import Body, read, say

MODEL_ID = say(
    "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$",
    "is 1 to 128 letters, digits or . _ : - (starting with a letter or digit)",
)
PATH = say("^[^\\u0000]*[^\\u0000\\s][^\\u0000]*$", "must not be blank or contain NUL characters")


class RegisterModel(Body):
    """A GGUF file to serve: its path under the models directory, and the id it is
    served as (the file name without `.gguf` when none is given)."""

    path: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=4096,
            pattern=PATH,
            description="A file under the models directory, relative to it.",
        ),
    ]
    id: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=128,
                pattern=MODEL_ID,
                description="1 to 128 letters, digits or . _ : - (starting with a letter or digit).",
            ),
        ]
        | None
    ) = None


@dataclass(frozen=True)
class Registration:
    path: str
    model_id: str | None


def parse_register(body: dict[str, Any]) -> Registration:
    asked = read(body, RegisterModel)
    return Registration(asked.path, asked.id)
