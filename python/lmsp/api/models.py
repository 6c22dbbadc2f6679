"""The model registry (LMSP B.4), delegated to the runtime."""

from __future__ import annotations

import falcon

from lmsp.service.keys import Answer
from lmsp.wire.models import parse_register

from . import idempotency
from .common import Deps, caller, set_json


class ModelsResource:
    scopes = {"GET": "models:read", "POST": "models:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        set_json(resp, {"object": "list", "data": list(self.deps.runtime.list_models())})

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = self.deps.body(req)
        asked = parse_register(body)

        def register() -> Answer:
            return 201, self.deps.runtime.register_model(
                asked.path, asked.model_id, rpc_servers=asked.rpc_servers, tensor_split=asked.tensor_split
            )

        idempotency.answer(self.deps.keys, req, resp, caller(req)["id"], body, register)


class ModelResource:
    scopes = {"GET": "models:read", "DELETE": "models:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, model_id: str) -> None:
        set_json(resp, self.deps.runtime.model_object(model_id))

    def on_delete(self, req: falcon.Request, resp: falcon.Response, model_id: str) -> None:
        self.deps.runtime.delete_model(model_id)
        set_json(resp, {"id": model_id, "object": "model", "deleted": True})


class ModelActionResource:
    """``POST /v1/models/{id}/load`` and ``/unload``."""

    scopes = {"POST": "models:write"}

    def __init__(self, deps: Deps, action: str) -> None:
        self.deps = deps
        self.action = action

    def on_post(self, req: falcon.Request, resp: falcon.Response, model_id: str) -> None:
        body = self.deps.no_body(req)
        runtime = self.deps.runtime

        def act() -> Answer:
            runtime.model_object(model_id)  # NotFound first
            if self.action == "load":
                return 200, runtime.load_model(model_id)
            return 200, runtime.unload_model(model_id)

        idempotency.answer(self.deps.keys, req, resp, caller(req)["id"], body, act)
