"""The Falcon WSGI application implementing LMSP part B.

``create_app(config, store, runtime)`` wires explicit dependencies (tests use
it directly); ``get_app()`` builds them from the configuration for gunicorn::

    gunicorn 'lmsp.app:get_app()'
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any, Callable

import falcon

from lmsp.contracts import RuntimeAPI
from lmsp.errors import LMSPError

from .api import (
    chat,
    clients,
    completions,
    console,
    conversations,
    embeddings,
    health,
    input_items,
    models,
    openapi,
    responses,
    service_history,
    tasks,
)
from .api.common import Deps
from .wire.input import SEED_MAX
from .api.logs import configure_logging
from .api.metrics import HttpMetrics
from .api.fleet import FleetRouting, RevokedResource
from .fleet.members import FleetMembers, members_for
from .api.middleware import Authentication, RequestContext, handle_http_error, handle_lmsp_error, handle_unexpected

log = logging.getLogger("lmsp.api")


def _random_seed() -> int:
    return secrets.randbelow(SEED_MAX + 1)


def routes(deps: Deps) -> list[tuple[str, object]]:
    """Every route of the API with its resource (also read by the OpenAPI test)."""
    return [
        ("/v1/service", health.ServiceResource(deps)),
        ("/v1/service/history", service_history.ServiceHistoryResource(deps)),
        ("/healthz", health.HealthResource()),
        ("/readyz", health.ReadyResource(deps)),
        ("/metrics", health.MetricsResource(deps)),
        ("/openapi.json", health.OpenAPIResource(openapi.document())),
        ("/v1/pairings", clients.PairingsResource(deps)),
        ("/v1/pair", clients.PairResource(deps)),
        ("/v1/clients", clients.ClientsResource(deps)),
        ("/v1/clients/{client_id}", clients.ClientResource(deps)),
        ("/v1/models", models.ModelsResource(deps)),
        ("/v1/models/{model_id}", models.ModelResource(deps)),
        ("/v1/models/{model_id}/load", models.ModelActionResource(deps, "load")),
        ("/v1/models/{model_id}/unload", models.ModelActionResource(deps, "unload")),
        ("/v1/responses", responses.ResponsesResource(deps)),
        ("/v1/responses/{response_id}", responses.ResponseResource(deps)),
        ("/v1/responses/{response_id}/cancel", responses.ResponseCancelResource(deps)),
        ("/v1/responses/{response_id}/input_items", input_items.InputItemsResource(deps)),
        ("/v1/conversations", conversations.ConversationsResource(deps)),
        ("/v1/conversations/{conversation_id}", conversations.ConversationResource(deps)),
        ("/v1/conversations/{conversation_id}/items", conversations.ConversationItemsResource(deps)),
        ("/v1/conversations/{conversation_id}/items/{item_id}", conversations.ConversationItemResource(deps)),
        ("/v1/tasks", tasks.TasksResource(deps)),
        ("/v1/tasks/{task_id}", tasks.TaskResource(deps)),
        ("/v1/tasks/{task_id}/cancel", tasks.TaskCancelResource(deps)),
        ("/v1/tasks/{task_id}/events", tasks.TaskEventsResource(deps)),
        ("/v1/chat/completions", chat.ChatCompletionsResource(deps)),
        ("/v1/chat/completions/{completion_id}", chat.ChatCompletionResource(deps)),
        ("/v1/chat/completions/{completion_id}/messages", chat.ChatCompletionMessagesResource(deps)),
        ("/v1/completions", completions.CompletionsResource(deps)),
        ("/v1/embeddings", embeddings.EmbeddingsResource(deps)),
        ("/v1/fleet/revoked", RevokedResource(deps)),
        *console.routes(),
    ]


def create_app(
    config: Any,
    store: Any,
    runtime: RuntimeAPI,
    *,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    random_seed: Callable[[], int] | None = None,
    fleet: FleetMembers | None = None,
) -> falcon.App:
    """The WSGI app over ``store`` and ``runtime`` (both already open/started)."""
    http_metrics = HttpMetrics()
    deps = Deps(
        config=config,
        store=store,
        runtime=runtime,
        clock=clock,
        monotonic=monotonic,
        random_seed=random_seed or _random_seed,
        http_metrics=http_metrics,
    )
    middleware = (
        RequestContext(http_metrics, monotonic),
        Authentication(store, clock, fleet),
        FleetRouting(config),
    )
    app = falcon.App(middleware=middleware, cors_enable=False)
    app.req_options.strip_url_path_trailing_slash = True
    app.req_options.auto_parse_qs_csv = False
    app.resp_options.secure_cookies_by_default = True
    for path, resource in routes(deps):
        app.add_route(path, resource)
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(falcon.HTTPError, handle_http_error)
    app.add_error_handler(LMSPError, handle_lmsp_error)
    return app


def get_app() -> falcon.App:
    """For gunicorn: configuration from the environment, the store opened, the
    runtime built and started in this (worker) process."""
    from lmsp import config as config_mod
    from lmsp.serving.hubsafe import hub_safe
    from lmsp.runtime import Runtime
    from lmsp.runtime.startup import open_store

    config = config_mod.load()
    configure_logging(config.log_level)
    store = open_store(config)
    runtime = Runtime(config, store)
    runtime.start()
    # Requests are greenlets: their store calls go through the hub's thread
    # pool so a lock wait blocks only the request that waits.
    safe = hub_safe(store)
    fleet = members_for(config, safe)
    if fleet is not None:
        fleet.start()
    app = create_app(config, safe, runtime, fleet=fleet)
    log.info("application ready", extra={"data_dir": str(config.data_dir)})
    return app
