"""``text.format`` with the scripted worker: each bad format a 400 with its
param and nothing stored; a good one kept with the task and echoed."""
from __future__ import annotations

import pytest
from api_helpers import assert_error

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
BAD = [
    ({"text": "json"}, "text"),
    ({"text": {"format": "json"}}, "text.format"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "schema": SCHEMA}}}, "text.format.name"),
    ({"text": {"format": {"type": "json_schema", "name": "a b", "schema": SCHEMA}}}, "text.format.name"),
    ({"text": {"format": {"type": "json_schema", "name": "x" * 65, "schema": SCHEMA}}}, "text.format.name"),
    ({"text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "name": "n", "schema": [1]}}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "name": "n", "schema": {"enum": ["x" * 40000]}}}},
     "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "name": "n", "schema": SCHEMA, "strict": "yes"}}},
     "text.format.strict"),
    ({"text": {"format": {"type": "json_schema", "name": "n", "schema": SCHEMA, "extra": 1}}},
     "text.format.extra"),
    ({"text": {"format": {"type": "json_object", "schema": SCHEMA}}}, "text.format.schema"),
    ({"text": {"format": {"type": "text"}, "verbosity": "loud"}}, "text.verbosity"),
    ({"text": {"other": 1}}, "text.other"),
]


def create(api, **fields):
    return api.post("/v1/responses", json={"model": "tiny", "input": "Say hello", **fields})


@pytest.mark.parametrize("fields,param", BAD)
def test_a_bad_text_format_is_refused_and_nothing_is_stored(user, fields, param):
    before = user.get("/v1/responses").json["data"]
    assert_error(create(user, **fields), 400, "invalid_request", param=param)
    assert user.get("/v1/responses").json["data"] == before


def test_the_format_is_echoed(user):
    plain, json_object = {"type": "text"}, {"type": "json_object"}
    assert create(user).json["text"] == {"format": plain, "verbosity": "medium"}
    assert create(user, text={"format": json_object}).json["text"] == {"format": json_object, "verbosity": "medium"}
    body = create(user, text={"format": {"type": "json_schema", "name": "n", "schema": SCHEMA}}).json
    # the schema stays with the task; Open Responses' JsonSchemaResponseFormat echoes it as null
    assert body["text"] == {"format": {"type": "json_schema", "name": "n", "description": None, "schema": None,
                                       "strict": False}, "verbosity": "medium"}
    assert user.get(f"/v1/responses/{body['id']}").json["text"] == body["text"]
