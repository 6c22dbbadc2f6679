"""The OpenAPI document is true to the app: the same routes and methods, the
same scopes, valid schemas. (Every answer of the API tests is also checked
against it, in ``api_helpers.Contract``.)"""
from __future__ import annotations

import jsonschema
import pytest
from api_helpers import assert_error

from lmsp.api.common import Deps
from lmsp.api.openapi import document
from lmsp.app import routes

METHODS = ("get", "head", "post", "put", "patch", "delete")


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
    for schema in doc["components"]["schemas"].values():
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


# (route, who, body schema, body): a body the service refuses with 400 (every field of
# every request schema, at each limit the validators enforce), which the document
# must refuse as well
REFUSED_BODIES = [
    ("/v1/responses", "user", "CreateResponse", {"model": "", "input": "hi"}),
    ("/v1/responses", "user", "CreateResponse", {"model": "m" * 257, "input": "hi"}),
    ("/v1/responses", "user", "CreateResponse", {"model": "tiny", "input": []}),
    ("/v1/responses", "user", "CreateResponse", {"model": "tiny", "input": "a\x00b"}),
    ("/v1/responses", "user", "CreateResponse",
     {"model": "tiny", "input": [{"role": "user", "content": "a\x00b"}]}),
    ("/v1/responses", "user", "CreateResponse",
     {"model": "tiny", "input": [{"role": "user", "content": [{"type": "input_text", "text": "\x00"}]}]}),
    ("/v1/responses", "user", "CreateResponse", {"model": "tiny", "input": "hi", "instructions": "\x00"}),
    ("/v1/responses", "user", "CreateResponse", {"model": "tiny", "input": "hi", "top_k": 2**31}),
    ("/v1/responses", "user", "CreateResponse", {"model": "tiny", "input": "hi", "stop": ""}),
    ("/v1/responses", "user", "CreateResponse", {"model": "tiny", "input": "hi", "stop": ["a", ""]}),
    ("/v1/responses", "user", "CreateResponse", {"model": "tiny", "input": "hi", "stop": "s" * 1001}),
    ("/v1/responses", "user", "CreateResponse", {"model": "tiny", "input": "hi", "stop": ["s" * 1001]}),
    ("/v1/responses", "user", "CreateResponse", {"model": "tiny", "input": "hi", "metadata": {"": "v"}}),
    ("/v1/responses", "user", "CreateResponse", {"model": "tiny", "input": "hi", "metadata": {"k" * 65: "v"}}),
    ("/v1/responses", "user", "CreateResponse",
     {"model": "tiny", "input": "hi", "background": True, "store": False}),
    ("/v1/responses", "user", "CreateResponse",
     {"model": "tiny", "input": [{"type": "reasoning", "summary": []}]}),
    ("/v1/responses", "user", "CreateResponse",
     {"model": "tiny", "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}),
    ("/v1/responses", "user", "CreateResponse",
     {"model": "tiny", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
    ("/v1/responses", "user", "CreateResponse", {"model": "tiny", "input": "hi", "tools": [{"type": "web_search"}]}),
    ("/v1/conversations", "user", "CreateConversation", {"items": [{"role": "user", "content": "a\x00"}]}),
    ("/v1/conversations", "user", "CreateConversation", {"items": [{"role": "user", "content": "hi"}] * 21}),
    ("/v1/conversations", "user", "CreateConversation", {"metadata": {"k": "v" * 513}}),
    ("/v1/conversations", "user", "CreateConversation", {"items": [{"type": "item_reference", "id": "msg_1"}]}),
    ("/v1/pairings", "admin", "PairingRequest", {"scopes": []}),
    ("/v1/pairings", "admin", "PairingRequest", {"name": ""}),
    ("/v1/pairings", "admin", "PairingRequest", {"name": "n" * 201}),
    ("/v1/pairings", "admin", "PairingRequest", {"name": "a\nb"}),
    ("/v1/pairings", "admin", "PairingRequest", {"name": "a\x9bb"}),
    ("/v1/pairings", "admin", "PairingRequest", {"expires_in": 86401}),
    ("/v1/pair", "anon", "PairRequest", {"code": "", "client_name": "app"}),
    ("/v1/pair", "anon", "PairRequest", {"code": "c" * 101, "client_name": "app"}),
    ("/v1/pair", "anon", "PairRequest", {"code": "ABCD-EFGH-JKLM", "client_name": ""}),
    ("/v1/pair", "anon", "PairRequest", {"code": "ABCD-EFGH-JKLM", "client_name": "n" * 201}),
    ("/v1/pair", "anon", "PairRequest", {"code": "ABCD-EFGH-JKLM", "client_name": "a\x07"}),
    ("/v1/models", "admin", "RegisterModel", {"path": ""}),
    ("/v1/models", "admin", "RegisterModel", {"path": "a\x00.gguf"}),
    ("/v1/models", "admin", "RegisterModel", {"path": "p" * 4097}),
    ("/v1/models", "admin", "RegisterModel", {"path": "tiny.gguf", "id": ""}),
    ("/v1/models", "admin", "RegisterModel", {"path": "tiny.gguf", "id": "-tiny"}),
    ("/v1/models", "admin", "RegisterModel", {"path": "tiny.gguf", "id": "a/b"}),
    ("/v1/models", "admin", "RegisterModel", {"path": "tiny.gguf", "id": "i" * 129}),
]


def schema_validator(doc: dict, name: str):
    return jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{name}",
                                            "components": doc["components"]})


@pytest.mark.parametrize("path,who,schema,body", REFUSED_BODIES)
def test_a_body_the_service_refuses_the_document_refuses(request, anon, path, who, schema, body):
    api = request.getfixturevalue(who)
    assert_error(api.post(path, json=body), 400, "invalid_request")
    assert not schema_validator(anon.get("/openapi.json").json, schema).is_valid(body), body


@pytest.mark.parametrize("body", [
    {"model": "tiny", "input": "hi", "stop": [], "metadata": {"k": ""}, "instructions": "",
     "top_k": 2**31 - 1, "background": False, "store": False},
    {"model": "tiny", "input": [{"role": "developer", "content": [{"type": "text", "text": ""}]},
                                {"role": "user", "content": "hi"}], "background": True, "store": True},
    {"model": "tiny", "input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                                {"type": "function_call_output", "call_id": "c1",
                                 "output": [{"type": "input_text", "text": "sunny"}]}]},
])
def test_a_body_the_document_allows_the_service_takes(user, anon, body):
    assert schema_validator(anon.get("/openapi.json").json, "CreateResponse").is_valid(body)
    assert user.post("/v1/responses", json=body).status_code in (200, 202)


def test_the_conversation_items_the_document_allows_the_service_takes(user, anon):
    body = {"items": [{"role": "user", "content": "hi"},
                      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                      {"type": "reasoning", "summary": []}], "metadata": {"k": "v"}}
    doc = anon.get("/openapi.json").json
    assert schema_validator(doc, "CreateConversation").is_valid(body)
    assert user.post("/v1/conversations", json=body).status_code == 200


def parameter(doc: dict, path: str, method: str, name: str) -> dict:
    return next(p["schema"] for p in doc["paths"][path][method]["parameters"] if p["name"] == name)


@pytest.mark.parametrize("path,value", [("/v1/responses", "task_1"), ("/v1/responses", "x"),
                                        ("/v1/tasks", "resp_1"), ("/v1/tasks", "a" * 101)])
def test_a_list_cursor_the_service_refuses_the_document_refuses(user, anon, path, value):
    assert_error(user.get(path, params={"after": value}), 400, "invalid_request", "after")
    schema = parameter(anon.get("/openapi.json").json, path, "get", "after")
    assert not jsonschema.Draft202012Validator(schema).is_valid(value)


def test_the_header_parameters_say_what_the_service_takes(user, anon):
    doc = anon.get("/openapi.json").json
    key = jsonschema.Draft202012Validator(parameter(doc, "/v1/responses", "post", "Idempotency-Key"))
    body = {"model": "tiny", "input": "hi"}
    assert_error(user.post("/v1/responses", json=body, headers={"Idempotency-Key": "k\u00e9y"}), 400,
                 "invalid_request", "Idempotency-Key")
    assert not key.is_valid("k\u00e9y") and not key.is_valid("a\tb") and key.is_valid("a key ~")
    last = jsonschema.Draft202012Validator(parameter(doc, "/v1/tasks/{task_id}/events", "get", "Last-Event-ID"))
    assert not last.is_valid(-1) and not last.is_valid(2**63) and last.is_valid(2**63 - 1)


@pytest.mark.parametrize("path,template,name", [
    ("/v1/responses/task_1", "/v1/responses/{response_id}", "response_id"),
    ("/v1/tasks/resp_1", "/v1/tasks/{task_id}", "task_id"),
    ("/v1/clients/resp_1", "/v1/clients/{client_id}", "client_id"),
])
def test_an_id_of_the_wrong_kind_is_refused_by_the_document_too(admin, anon, path, template, name):
    assert_error(admin.get(path), 404, "not_found")
    schema = parameter(anon.get("/openapi.json").json, template, "get", name)
    assert not jsonschema.Draft202012Validator(schema).is_valid(path.rsplit("/", 1)[1])


@pytest.mark.parametrize("path", ["/v1/models/tiny/load", "/v1/models/tiny/unload"])
def test_the_posts_without_fields_take_an_empty_object_as_documented(admin, anon, path):
    doc = anon.get("/openapi.json").json
    body = doc["paths"][path.replace("tiny", "{model_id}")]["post"]["requestBody"]
    assert body["required"] is False
    schema = {**body["content"]["application/json"]["schema"], "components": doc["components"]}
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid({}) and not validator.is_valid({"force": True})
    assert admin.post(path, json={}).status_code == 200
    assert_error(admin.post(path, json={"force": True}), 400, "invalid_request", "force")
