"""The OpenAPI document is true to the app: the same routes and methods, the
same scopes, valid schemas. (Every answer of the API tests is also checked
against it, in ``api_helpers.Contract``.)"""
from __future__ import annotations

import jsonschema

from lmsp.api.common import Deps
from lmsp.api.openapi import document
from lmsp.app import routes

METHODS = ("get", "post", "put", "patch", "delete")


def app_routes(config, store, scripted) -> dict[str, dict[str, object]]:
    out = {}
    for path, resource in routes(Deps(config=config, store=store, runtime=scripted)):
        out[path] = {m: resource for m in METHODS if hasattr(resource, f"on_{m}")}
    return out


def test_every_route_is_documented_and_nothing_else(config, store, scripted):
    doc = document()
    actual = {path: set(methods) for path, methods in app_routes(config, store, scripted).items()}
    documented = {path: {m for m in item if m in METHODS} for path, item in doc["paths"].items()}
    assert actual == documented


def test_documented_scopes_are_the_enforced_ones(config, store, scripted):
    doc = document()
    for path, methods in app_routes(config, store, scripted).items():
        for method, resource in methods.items():
            op = doc["paths"][path][method]
            enforced = (getattr(resource, "scopes", None) or {}).get(method.upper())
            assert op.get("x-lmsp-scope") == enforced, (method, path)
            assert (op["security"] == []) == (enforced is None), (method, path)


def test_schemas_are_valid_json_schema(anon):
    doc = anon.get("/openapi.json").json
    assert doc["openapi"].startswith("3.1")
    for name, schema in doc["components"]["schemas"].items():
        jsonschema.Draft202012Validator.check_schema(schema)
    refs = set()

    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                refs.add(node["$ref"].rsplit("/", 1)[1])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    assert refs <= set(doc["components"]["schemas"])


def test_the_request_schema_agrees_with_the_validation(user, anon):
    doc = anon.get("/openapi.json").json
    schema = {"$ref": "#/components/schemas/CreateResponse", "components": doc["components"]}
    validator = jsonschema.Draft202012Validator(schema)
    good = {"model": "tiny", "input": [{"role": "user", "content": "hi"}], "seed": 3, "stop": ["x"],
            "metadata": {"a": "b"}, "on_restart": "retry"}
    bad = {"model": "tiny", "input": "hi", "temperature": 3}
    assert validator.is_valid(good)
    assert user.post("/v1/responses", json=good).status_code == 200
    assert not validator.is_valid(bad)
    assert user.post("/v1/responses", json=bad).status_code == 400
