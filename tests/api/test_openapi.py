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


HI = {"role": "user", "content": "hi"}

# (route, who, body schema, body): a body the service refuses with 400 (every field of
# every request schema, at each limit the validators enforce), which the document
# must refuse as well; the route is POSTed to unless it names its method
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
    *[("PATCH /v1/clients/cli_X", "admin", "UpdateClient", body) for body in [
        {"priority": 0}, {"priority": 101}, {"priority": None}, {"priority": 1.5}, {"max_running": -1},
        {"max_queued": True}, {"tokens_per_hour": "1000"}, {"max_queued": -1}, {"name": "x"},
    ]],
    ("/v1/models", "admin", "RegisterModel", {"path": ""}),
    ("/v1/models", "admin", "RegisterModel", {"path": "a\x00.gguf"}),
    ("/v1/models", "admin", "RegisterModel", {"path": "p" * 4097}),
    ("/v1/models", "admin", "RegisterModel", {"path": "tiny.gguf", "id": ""}),
    ("/v1/models", "admin", "RegisterModel", {"path": "tiny.gguf", "id": "-tiny"}),
    ("/v1/models", "admin", "RegisterModel", {"path": "tiny.gguf", "id": "a/b"}),
    ("/v1/models", "admin", "RegisterModel", {"path": "tiny.gguf", "id": "i" * 129}),
    *[("/v1/chat/completions", "user", "CreateChatCompletion", {"model": "tiny", "messages": [HI], **fields})
      for fields in [
          {"model": ""}, {"messages": []}, {"messages": [{"role": "user", "content": "a\x00b"}]},
          {"messages": [{"role": "user", "content": [{"type": "text", "text": "\x00"}]}]},
          {"messages": [{"role": "robot", "content": "x"}]}, {"messages": [{"role": "user"}]},
          {"messages": [{"role": "user", "content": "x", "name": "bob"}]},
          {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]},
          {"messages": [{"role": "assistant", "content": None}]},
          {"messages": [{"role": "assistant", "content": "x", "refusal": "no"}]},
          {"messages": [{"role": "assistant", "content": "x", "reasoning_content": "\x00"}]},
          {"messages": [{"role": "assistant", "tool_calls": [{"id": "", "function": {"name": "f", "arguments": ""}}]}]},
          {"messages": [{"role": "tool", "content": "x"}]},
          {"temperature": 3}, {"top_p": 0}, {"top_k": 2**31}, {"max_tokens": 0}, {"max_completion_tokens": 0},
          {"seed": -1}, {"seed": 2**32 - 1}, {"stop": [""]}, {"stop": ["s"] * 17}, {"user": "u" * 513},
          {"n": 2}, {"presence_penalty": 0.5}, {"frequency_penalty": -1}, {"logit_bias": {"1": 5}},
          {"functions": [{"name": "f"}]}, {"function_call": "auto"}, {"modalities": ["audio"]}, {"audio": {}},
          {"reasoning_effort": "low"}, {"logprobs": 1}, {"top_logprobs": 2}, {"logprobs": True, "top_logprobs": 21},
          {"stream_options": {"include_usage": True}},
          {"stream": True, "stream_options": {"include_obfuscation": True}},
          {"metadata": {"k": 1}}, {"background": True}, {"tools": [{"type": "web_search"}]},
          {"tools": [{"type": "function", "function": {"name": "a b"}}]},
          {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "sometimes"},
          {"tool_choice": {"type": "function", "name": "f"}}, {"response_format": {"type": "xml"}},
          {"response_format": {"type": "json_object", "strict": True}}, {"response_format": {"type": "json_schema"}},
          {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": [1]}}},
      ]],
    *[("/v1/completions", "user", "CreateCompletion", {"model": "tiny", "prompt": "hi", **fields}) for fields in [
        {"prompt": []}, {"prompt": "a\x00b"}, {"prompt": [1, -2]}, {"prompt": ["a"] * 65}, {"prompt": {"text": "x"}},
        {"suffix": "a\x00"}, {"echo": True, "suffix": "end"}, {"prompt": ["a", "b"], "stream": True},
        {"logprobs": 6}, {"best_of": 3}, {"n": 2}, {"stop": ""}, {"stream_options": {"include_usage": True}},
        {"messages": []},
    ]],
    *[("/v1/chat/completions/chatcmpl-none", "user", "UpdateChatCompletion", body) for body in [
        {}, {"metadata": {"k": 1}}, {"metadata": {"": "v"}}, {"metadata": {}, "model": "tiny"},
    ]],
]


def schema_validator(doc: dict, name: str):
    return jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{name}",
                                            "components": doc["components"]})


@pytest.mark.parametrize("path,who,schema,body", REFUSED_BODIES)
def test_a_body_the_service_refuses_the_document_refuses(request, anon, path, who, schema, body):
    api = request.getfixturevalue(who)
    method, _, path = path.rpartition(" ")
    assert_error(api.request(method or "POST", path, json=body), 400, "invalid_request")
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


@pytest.mark.parametrize("path,schema,body", [
    ("/v1/chat/completions", "CreateChatCompletion",
     {"model": "tiny", "messages": [{"role": "developer", "content": [{"type": "text", "text": ""}]}, HI,
                                    {"role": "assistant", "content": None, "refusal": None, "annotations": [],
                                     "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]},
                                    {"role": "tool", "tool_call_id": "c", "content": "ok"}],
      "n": 1, "presence_penalty": 0, "logit_bias": {}, "functions": [], "modalities": ["text"], "audio": None,
      "stop": [], "seed": 2**32 - 2, "top_k": 2**31 - 1, "logprobs": True, "top_logprobs": 20, "stream": True,
      "stream_options": {"include_usage": True, "include_obfuscation": False}, "metadata": {"k": ""},
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": False,
      "response_format": {"type": "json_object"}, "store": True, "user": ""}),
    ("/v1/completions", "CreateCompletion",
     {"model": "tiny", "prompt": ["a", [1, 2]], "echo": True, "logprobs": 5, "best_of": 1, "stop": "x"}),
    ("/v1/completions", "CreateCompletion",
     {"model": "tiny", "prompt": [1, 2], "suffix": "", "stream": True, "stream_options": {"include_usage": False}}),
])
def test_an_openai_body_the_document_allows_the_service_takes(user, anon, path, schema, body):
    assert schema_validator(anon.get("/openapi.json").json, schema).is_valid(body)
    assert user.post(path, json=body).status_code == 200


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
