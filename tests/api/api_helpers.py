"""Small helpers of the API tests: an authenticated test client and SSE parsing."""
from __future__ import annotations

import contextlib
import json
import re
import shutil

import falcon.testing
import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from lmsp import auth
from lmsp.api.openapi import document
from lmsp.app import create_app
from lmsp.config import Config
from lmsp.runtime import RECOVERED_ENV, Runtime, open_store


class Contract:
    """Checks answers against the OpenAPI document: the JSON body of every
    documented status, and each event of an event stream."""

    def __init__(self) -> None:
        self.doc = document()
        resource = Resource.from_contents(self.doc, default_specification=DRAFT202012)
        self.registry = Registry().with_resource("urn:lmsp", resource)
        self.routes = []
        for template in self.doc["paths"]:
            pattern = re.sub(r"\\{[a-z_]+\\}", "[^/]+", re.escape(template))
            self.routes.append((re.compile(f"^{pattern}$"), template))

    def template(self, path: str) -> str | None:
        for pattern, template in self.routes:
            if pattern.match(path):
                return template
        return None

    def validator(self, schema: dict):
        return jsonschema.Draft202012Validator({"$ref": "urn:lmsp" + schema["$ref"]}
                                               if "$ref" in schema else schema, registry=self.registry)

    def check(self, method: str, path: str, result) -> None:
        template = self.template(path.split("?")[0])
        if template is None:
            return
        op = self.doc["paths"][template].get(method.lower())
        if op is None:
            return
        documented = op["responses"].get(str(result.status_code))
        assert documented is not None, f"{method} {template} answered an undocumented {result.status_code}"
        if method.upper() == "HEAD":
            assert result.content == b"", f"HEAD {template} sent a body"
            return
        ctype = (result.headers.get("Content-Type") or "").split(";")[0]
        content = documented.get("content", {})
        assert ctype in content, f"{method} {template} {result.status_code}: undocumented type {ctype}"
        if ctype == "application/json":
            self.validator(content[ctype]["schema"]).validate(result.json)
        elif ctype == "text/event-stream":
            # LMSP's events, or the chunks the route documents (OpenAI's endpoints)
            schema = content[ctype].get("x-event-schema", {"$ref": "#/components/schemas/Event"})
            event = self.validator(schema)
            for frame in parse_sse(result.text):
                if "data" in frame and frame.get("event") != "error" and frame["data"] != "[DONE]":
                    event.validate(frame["data"])




# checks every answer of every Api goes through (the conftest's fixtures add theirs):
# each is called as check(method, path, result)
ANSWER_CHECKS: list = []


class Api:
    """``falcon.testing.TestClient`` with a bearer token."""

    def __init__(self, app, token: str | None = None, contract: Contract | None = None) -> None:
        self.app = app
        self.client = falcon.testing.TestClient(app)
        self.token = token
        self.contract = contract or Contract()

    def as_(self, token: str | None) -> "Api":
        return Api(self.app, token, self.contract)

    def request(self, method: str, path: str, *, headers: dict | None = None, **kw):
        headers = dict(headers or {})
        if self.token is not None:
            headers.setdefault("Authorization", f"Bearer {self.token}")
        result = self.client.simulate_request(method, path, headers=headers, **kw)
        self.contract.check(method, path, result)
        for check in ANSWER_CHECKS:
            check(method, path, result)
        return result

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, **kw):
        return self.request("POST", path, **kw)

    def patch(self, path, **kw):
        return self.request("PATCH", path, **kw)

    def delete(self, path, **kw):
        return self.request("DELETE", path, **kw)


def make_client(store, scopes, name="test") -> tuple[dict, str]:
    token = auth.new_token()
    client = store.create_client(name=name, scopes=list(scopes), token_hash=auth.hash_token(token))
    return client, token


def parse_sse(text: str) -> list[dict]:
    """SSE frames as dicts: ``{"id", "event", "data"}`` (data parsed), each comment line as
    ``{"comment"}`` (a keep-alive is a comment line alone, with no blank line after it)."""
    frames = []
    for block in text.split("\n\n"):
        frame: dict = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                frames.append({"comment": line[1:].strip()})
            elif line:
                field, _, value = line.partition(": ")
                # OpenAI's streams end with ``data: [DONE]``, which is not JSON
                frame[field] = json.loads(value) if field == "data" and value != "[DONE]" else value
        if frame:
            frames.append(frame)
    return frames


def sse_events(text: str) -> list[dict]:
    """The frames of :func:`parse_sse` without keep-alive comments, which a slow
    machine may put anywhere in a stream (``heartbeat_seconds``)."""
    return [f for f in parse_sse(text) if "comment" not in f]


def assert_error(result, status: int, code: str, param=None) -> dict:
    assert result.status_code == status, result.text
    body = result.json
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "param"}
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param, body
    return body["error"]


@contextlib.contextmanager
def live_service(data, demo_model_path, **settings):
    """The app over a started REAL runtime in ``data`` (this process plays the master: no
    start-up preparation), the demo model registered as ``tiny``; yields
    ``{"config", "store", "runtime", "app", "admin", "model"}``, stopped after."""
    mp = pytest.MonkeyPatch()
    mp.setenv(RECOVERED_ENV, "1")
    config = Config(data_dir=data, n_threads=2, lease_seconds=5.0, heartbeat_seconds=1.0, **settings).validated()
    for path in (config.models_dir, config.snapshots_dir):
        path.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(demo_model_path, config.models_dir / "tiny.gguf")
    store = open_store(config)
    runtime = Runtime(config, store)
    runtime.start()
    try:
        app = create_app(config, store, runtime)
        _, admin_token = make_client(store, ["admin"], "admin")
        admin = Api(app, admin_token)
        registered = admin.post("/v1/models", json={"path": "tiny.gguf", "id": "tiny"})
        assert registered.status_code == 201, registered.text
        yield {"config": config, "store": store, "runtime": runtime, "app": app, "admin": admin,
               "model": registered.json}
    finally:
        runtime.stop(timeout=10.0)
        store.close()
        mp.undo()
