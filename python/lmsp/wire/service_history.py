"""The service's own history as ``GET /v1/service/history`` answers it: a point a
minute, for the operator's plots."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from .structs import Answer

Count = Annotated[int, Meta(ge=0)]


class ServiceHistoryMinute(Answer):
    """One minute of the service, every worker summed: tokens generated per second, tasks
    queued and sequences running when it ended, time to first token, failed tasks, and
    the bytes on disk (null: not known)."""

    at: Annotated[int, Meta(ge=0, description="The minute's start, Unix seconds.")]
    tokens_per_second: Annotated[float, Meta(ge=0)]
    queued: Count
    running: Count
    ttft_p50_ms: Annotated[float, Meta(ge=0)] | None
    ttft_p99_ms: Annotated[float, Meta(ge=0)] | None
    errors: Count
    db_bytes: Count | None
    kv_bytes: Count | None
    model_bytes: Count | None


class ServiceHistory(Answer):
    """The service's minutes, oldest first; a minute no worker recorded (the service was
    down) is absent."""

    object: Literal["list"]
    interval_seconds: Literal[60]
    data: list[ServiceHistoryMinute]


#: the history's answers, as the OpenAPI document names them
ANSWERS = (ServiceHistory, ServiceHistoryMinute)
