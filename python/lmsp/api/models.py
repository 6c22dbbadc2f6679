"""The model registry (LMSP B.4), delegated to the runtime."""

from __future__ import annotations

import re

import falcon

from lmsp.errors import InvalidRequest
from lmsp.service.keys import Answer
from lmsp.wire.fields import get_str, reject_unknown

from . import idempotency
from .common import Deps, caller, set_json

MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def check_model_id(value: str, param: str = "id") -> str:
    if not MODEL_ID.match(value):
        raise InvalidRequest(
            "a model id is 1 to 128 letters, digits or . _ : - (starting with a letter or digit)", param=param
        )
    return value


class ModelsResource:
    scopes = {"GET": "models:read", "POST": "models:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        set_json(resp, {"object": "list", "data": list(self.deps.runtime.list_models())})

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = self.deps.body(req)
        reject_unknown(body, ("path", "id"))
        path = get_str(body, "path", required=True, max_len=4096)
        model_id = get_str(body, "id", max_len=128)
        if model_id is not None:
            check_model_id(model_id)
        if "\x00" in path:
            raise InvalidRequest("'path' must not contain NUL characters", param="path")

        def register() -> Answer:
            return 201, self.deps.runtime.register_model(path, model_id)

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
