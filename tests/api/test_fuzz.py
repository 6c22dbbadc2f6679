"""Bad input of any shape gets a 4xx error body, never a 500 (B.1)."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FIELDS = ["model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "top_k", "seed",
          "stop", "stream", "background", "store", "on_restart", "metadata",
          # the Open Responses fields (B.11)
          "include", "top_logprobs", "truncation", "tools", "tool_choice", "text", "parallel_tool_calls",
          "max_tool_calls", "user", "safety_identifier", "prompt_cache_key", "service_tier", "stream_options",
          "presence_penalty", "frequency_penalty", "reasoning", "previous_response_id", "conversation", "prompt"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)

# input items as the SDKs send and echo them, with any value in each field
items = st.dictionaries(st.sampled_from(["type", "role", "content", "id", "status", "phase", "summary",
                                         "encrypted_content"]), json_values, max_size=5)

bodies = st.dictionaries(st.sampled_from(FIELDS + ["extra"]), json_values | st.lists(items, max_size=3), max_size=6)

SETTINGS = settings(max_examples=120, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def check(result):
    assert result.status_code < 500, result.text
    if result.status_code >= 400:
        error = result.json["error"]
        assert isinstance(error["code"], str) and error["message"]


@SETTINGS
@given(body=bodies)
def test_create_response_with_any_fields(user, scripted, body):
    body = {"model": "tiny", "input": "hi", **body}  # the scripted worker finishes every task at once
    check(user.post("/v1/responses", json=body))


@SETTINGS
@given(raw=st.binary(max_size=200))
def test_any_bytes_as_a_body(user, raw):
    check(user.post("/v1/responses", body=raw, headers={"Content-Type": "application/json"}))
    check(user.post("/v1/pair", body=raw, headers={"Content-Type": "application/json"}))


@SETTINGS
@given(params=st.dictionaries(st.sampled_from(["limit", "after", "status", "stream", "starting_after"]),
                              st.text(max_size=12), max_size=4),
       path=st.sampled_from(["/v1/responses", "/v1/tasks", "/v1/responses/resp_X", "/v1/tasks/task_X/events"]))
def test_any_query_parameters(user, params, path):
    check(user.get(path, params=params))


@SETTINGS
@given(value=st.text(max_size=40))
def test_any_pairing_request(anon, value):
    check(anon.post("/v1/pair", json={"code": value, "client_name": value}))
    check(anon.post("/v1/pair", body=json.dumps({"code": value}), headers={"Content-Type": "application/json"}))
