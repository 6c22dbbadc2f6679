"""A client's share of the box, changed by an admin (``PATCH /v1/clients/{id}``):
its priority and its limits."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import UNSET, Meta, UnsetType

from lmsp.contracts import MAX_PRIORITY

from .structs import Body, read


Priority = Annotated[int, Meta(ge=1, le=MAX_PRIORITY, description="Turns at starting tasks against a client of 1.")]
Limit = Annotated[int, Meta(ge=0)]
Running = Annotated[Limit | None, Meta(description="Tasks started at once; null: no limit.")]
Queued = Annotated[Limit | None, Meta(description="Tasks waiting to start; one more is 429 rate_limited.")]
PerHour = Annotated[
    Limit | None,
    Meta(description="Input and output tokens of finished tasks per clock hour; past it, 429 quota_exceeded."),
]


class UpdateClient(Body):
    """A client's priority and limits to change: any of them, the others kept; null
    takes a limit away."""

    priority: Priority | UnsetType = UNSET
    max_running: Running | UnsetType = UNSET
    max_queued: Queued | UnsetType = UNSET
    tokens_per_hour: PerHour | UnsetType = UNSET


def parse_update(body: dict[str, Any]) -> dict[str, int | None]:
    """The limits the body sets, by name (None: no limit)."""
    asked = read(body, UpdateClient)
    return {name: value for name in UpdateClient.__struct_fields__ if (value := getattr(asked, name)) is not UNSET}
