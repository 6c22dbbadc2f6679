"""``GET /v1/service``, ``/healthz``, ``/readyz``, ``/metrics`` and ``/openapi.json``."""

from __future__ import annotations

import logging
from typing import Any

import falcon

import lmsp
from lmsp.errors import LMSPError, Unavailable

from . import metrics as prom
from .common import Deps, set_json

log = logging.getLogger("lmsp.api")

CAPABILITIES = (
    "responses",  # POST /v1/responses, plain
    "responses.stream",  # stream: true
    "responses.background",  # background: true, 202 + Location
    "responses.stream_resume",  # GET /v1/responses/{id}?stream=true&starting_after=N
    "tasks",  # /v1/tasks and their event logs
    "cancel",
    "idempotency",
    "pairing",
    "models",
    "on_restart.fail",
    "on_restart.retry",
    "on_restart.resume",
    "chat.completions",  # POST /v1/chat/completions, and the stored ones (B.11)
    "completions",  # POST /v1/completions
    "embeddings",  # POST /v1/embeddings
)


class ServiceResource:
    scopes = {"GET": None}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        identity = self.deps.store.identity()
        set_json(
            resp,
            {
                "service_id": identity["service_id"],
                "object": "service",
                "name": self.deps.config.name,
                "version": lmsp.__version__,
                "protocol": lmsp.PROTOCOL,
                "capabilities": list(CAPABILITIES),
                "created_at": identity.get("created_at"),
            },
        )


class HealthResource:
    """Liveness: the process answers."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        set_json(resp, {"status": "ok"})

    on_head = on_get  # Falcon sends the GET's status and headers without the body


class ReadyResource:
    """Readiness: start-up recovery has run and the runtime is started."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        runtime = self.deps.runtime
        if not runtime.ready or runtime.draining:
            raise Unavailable("the service is starting or stopping", retry_after=1)
        set_json(resp, {"status": "ready"})

    on_head = on_get


class MetricsResource:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        deps = self.deps
        counts = clients = None
        try:
            counts = deps.store.task_counts()
            clients = deps.store.client_figures()
        except LMSPError as exc:  # a locked store must not break scraping
            log.warning("task counts unavailable for /metrics: %s", exc.message)
        runtime_figures = deps.runtime.metrics()
        resp.status = 200
        resp.content_type = prom.CONTENT_TYPE
        resp.text = prom.render(
            task_counts=counts,
            runtime_metrics=runtime_figures,
            http=deps.http_metrics,
            ready=deps.runtime.ready,
            clients=clients,
            box=getattr(deps.config, "box_id", ""),
        )

    on_head = on_get


class OpenAPIResource:
    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        set_json(resp, self.document)
