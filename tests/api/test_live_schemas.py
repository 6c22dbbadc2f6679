"""Schemas no output could satisfy, over the real runtime (the demo model of
test_live.py): each is a 400 ``invalid_request`` whose ``param`` is the exact
keyword in the caller's own terms (Chat Completions' ``response_format`` and
``function.parameters``, Responses' ``text.format`` and ``parameters``), and no
task is made of it."""
from __future__ import annotations

import pytest
from api_helpers import assert_error
from test_live import client, live  # noqa: F401  (the started runtime of test_live.py)

UNSATISFIABLE = [
    ({"type": "object", "properties": {"a": {"type": "string", "minLength": 5, "maxLength": 2}}},
     "properties.a.maxLength"),
    ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 2}}},
     "properties.a.maximum"),
    ({"type": "object", "properties": {"a": {"type": "array", "minItems": 3, "maxItems": 1}}},
     "properties.a.maxItems"),
    ({"type": "object", "properties": {"a": {"type": "array", "minItems": 100000}}}, "properties.a.minItems"),
    ({"type": "object", "properties": {"a": {"enum": []}}}, "properties.a.enum"),
    ({"type": "object", "properties": {"a": {"type": "boolean", "const": "yes"}}}, "properties.a.const"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"], "additionalProperties": False},
     "required[0]"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/loop"}},
      "$defs": {"loop": {"type": "object", "properties": {"next": {"$ref": "#/$defs/loop"}}, "required": ["next"]}}},
     "$defs.loop.properties.next.$ref"),
]
# each form: the request's fields for a schema, and the param of the schema's root
FORMS = {
    "responses text.format": ("/v1/responses", lambda s: {"text": {"format": {
        "type": "json_schema", "name": "x", "schema": s}}}, "text.format.schema"),
    "responses tools": ("/v1/responses", lambda s: {"tools": [
        {"type": "function", "name": "f", "parameters": s}], "tool_choice": "required"}, "tools[0].parameters"),
    "chat response_format": ("/v1/chat/completions", lambda s: {"response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": s}}}, "response_format.json_schema.schema"),
    "chat tools": ("/v1/chat/completions", lambda s: {"tools": [
        {"type": "function", "function": {"name": "f", "parameters": s}}], "tool_choice": "required"},
        "tools[0].function.parameters"),
}


def post(client, path: str, fields: dict):  # noqa: F811
    if path == "/v1/chat/completions":
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}
    else:
        body = {"model": "tiny", "input": "hi", "max_output_tokens": 4, **fields}
    return client.post(path, json=body)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("schema,path", UNSATISFIABLE)
def test_an_unsatisfiable_schema_is_a_400_naming_its_keyword(client, live, form, schema, path):  # noqa: F811
    route, fields, root = FORMS[form]
    before = live["store"].list_tasks(limit=1)["data"]
    response = post(client, route, fields(schema))
    assert_error(response, 400, "invalid_request", param=f"{root}.{path}")
    assert live["store"].list_tasks(limit=1)["data"] == before  # no task was made of it


@pytest.mark.parametrize("form", FORMS)
def test_a_satisfiable_schema_runs(client, form):  # noqa: F811
    route, fields, _ = FORMS[form]
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 2, "maxLength": 2}},
              "required": ["a"], "additionalProperties": False}
    response = post(client, route, fields(schema))
    assert response.status_code == 200, response.text
