"""A model file registered (``POST /v1/models``, LMSP B.4): its path under the
models directory, the id it is served as, and the RPC servers it is split over."""

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
    rpc_servers: (
        Annotated[
            list[Annotated[str, Meta(min_length=3, max_length=300)]],
            Meta(
                max_length=16,
                description="`lmsp rpc-server` addresses (HOST:PORT) to split the model's layers over, "
                "with this box (docs/RPC.md); none: the service's rpc_servers setting.",
            ),
        ]
        | None
    ) = None
    tensor_split: (
        Annotated[
            list[Annotated[float, Meta(ge=0)]],
            Meta(
                max_length=17,
                description="With rpc_servers: this box's share of the layers, then each server's "
                "(none: by free memory).",
            ),
        ]
        | None
    ) = None


@dataclass(frozen=True)
class Registration:
    path: str
    model_id: str | None
    rpc_servers: list[str] | None = None
    tensor_split: list[float] | None = None


def parse_register(body: dict[str, Any]) -> Registration:
    asked = read(body, RegisterModel)
    return Registration(asked.path, asked.id, asked.rpc_servers, asked.tensor_split)
