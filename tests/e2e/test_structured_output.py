"""Structured output on the real model: ``text.format`` json_schema and
json_object hold the output to the grammar llama.cpp's converter makes of the
schema, so the text always parses (and validates); the official ``openai``
client's ``responses.parse`` works unmodified; a schema the converter cannot
express is refused before anything is stored."""
from __future__ import annotations

import json
import math

import jsonschema
import openai
import pytest
from e2e_helpers import deltas, sse_events
from pydantic import BaseModel
from test_real_model import INSTRUCTIONS, MODEL, smollm2_fixtures

pytestmark = pytest.mark.real_model

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
ABOUT_JOHN = "John is 31 years old. Give his name and age."


class Person(BaseModel):
    name: str
    age: int


server, token = smollm2_fixtures("structured")


def create(server, token, expect=200, **body) -> dict:
    return server.call("POST", "/v1/responses", {"model": MODEL, "instructions": INSTRUCTIONS, **body},
                       token=token, expect=expect)


def text_of(response: dict) -> str:
    return "".join(part["text"] for item in response["output"] for part in item["content"])


def schema_format(schema: dict, strict: bool = True) -> dict:
    return {"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": strict}}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_json_schema_answer_parses_and_validates(server, token, seed):
    response = create(server, token, input=ABOUT_JOHN, seed=seed, temperature=1.0, max_output_tokens=120,
                      text=schema_format(PERSON))
    assert response["status"] == "completed", response
    jsonschema.validate(json.loads(text_of(response)), PERSON)
    # Open Responses' JsonSchemaResponseFormat echoes the schema as null
    assert response["text"]["format"] == {"type": "json_schema", "name": "person", "description": None,
                                          "schema": None, "strict": True}


def test_json_object_gives_a_json_object(server, token):
    response = create(server, token, input="What is the capital of France? Answer in JSON.", temperature=0,
                      max_output_tokens=200,
                      text={"format": {"type": "json_object"}})
    assert response["status"] == "completed", response
    assert isinstance(json.loads(text_of(response)), dict)
    assert response["text"] == {"format": {"type": "json_object"}, "verbosity": "medium"}


def test_a_streamed_json_schema_answer_is_the_plain_one(server, token):
    body = {"model": MODEL, "instructions": INSTRUCTIONS, "input": ABOUT_JOHN, "temperature": 0,
            "max_output_tokens": 120, "text": schema_format(PERSON)}
    plain = text_of(create(server, token, **{k: v for k, v in body.items() if k != "model"}))
    events = list(sse_events("127.0.0.1", server.port, "POST", "/v1/responses", token=token,
                             body={**body, "stream": True}, timeout=60))
    assert deltas(events) == plain
    jsonschema.validate(json.loads(plain), PERSON)


def test_openai_responses_parse_gives_the_pydantic_model(server, token):
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=token, timeout=60.0, max_retries=0) as client:
        response = client.responses.parse(model=MODEL, instructions=INSTRUCTIONS, input=ABOUT_JOHN,
                                          text_format=Person, temperature=0, max_output_tokens=120)
    assert isinstance(response.output_parsed, Person)
    assert response.output_parsed.age >= 0


@pytest.mark.parametrize("schema,keyword", [
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "$ref"),
    ({"type": "object", "properties": {"a": {"$ref": "https://example.invalid/schema.json"}}}, "$ref"),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "not"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "[a-z]+"}}}, "pattern"),
])
def test_a_schema_the_grammar_cannot_express_is_refused_and_nothing_is_stored(server, token, schema, keyword):
    before = server.call("GET", "/v1/responses?limit=100", token=token)["data"]
    error = create(server, token, expect=400, input="Hi", text=schema_format(schema))["error"]
    assert error["code"] == "invalid_request"
    assert error["param"] == f"text.format.schema.properties.a.{keyword}"
    assert server.call("GET", "/v1/responses?limit=100", token=token)["data"] == before


def test_log_probabilities_are_those_of_the_allowed_tokens(server, token):
    """The schema's grammar allows only an opening brace first (with or without the
    quote after it), so every alternative at the first position opens one; greedy
    tokens are their positions' likeliest; the alternatives sum to at most 1."""
    response = create(server, token, input=ABOUT_JOHN, temperature=0, max_output_tokens=120,
                      text=schema_format(PERSON), top_logprobs=5, include=["message.output_text.logprobs"])
    assert response["status"] == "completed", response
    [part] = response["output"][0]["content"]
    entries = part["logprobs"]
    assert "".join(e["token"] for e in entries) == part["text"]
    assert entries[0]["top_logprobs"] and all(a["token"].startswith("{") for a in entries[0]["top_logprobs"])
    for e in entries:
        alternatives = e["top_logprobs"]
        assert (alternatives[0]["token"], alternatives[0]["logprob"]) == (e["token"], e["logprob"])
        assert sum(math.exp(a["logprob"]) for a in alternatives) <= 1 + 1e-5
