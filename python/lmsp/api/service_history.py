"""``GET /v1/service/history``: the service's own history by minute, for the
operator's plots (:mod:`lmsp.store.history` keeps it)."""

from __future__ import annotations

from typing import Any

import falcon

from lmsp.store.history import MINUTE, percentile

from .common import Deps, query_int, set_json

MAX_MINUTES = 1440  # a day: what the history keeps at most


class ServiceHistoryResource:
    scopes = {"GET": "models:read"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        minutes = query_int(req, "minutes", default=60, minimum=1, maximum=MAX_MINUTES)
        rows = self.deps.store.service_history(minutes)
        set_json(resp, {"object": "list", "interval_seconds": MINUTE, "data": [minute_object(r) for r in rows]})


def minute_object(row: dict[str, Any]) -> dict[str, Any]:
    """A minute of the history as the API answers it (``ServiceHistoryMinute``)."""
    p50, p99 = percentile(row["ttft"], 0.5), percentile(row["ttft"], 0.99)
    return {
        "at": int(row["minute"]) * MINUTE,
        "tokens_per_second": int(row["tokens"]) / MINUTE,
        "queued": int(row["queued"]),
        "running": int(row["running"]),
        "ttft_p50_ms": None if p50 is None else round(p50, 3),
        "ttft_p99_ms": None if p99 is None else round(p99, 3),
        "errors": int(row["errors"]),
        "db_bytes": row["db_bytes"],
        "kv_bytes": row["kv_bytes"],
        "model_bytes": row["model_bytes"],
    }
