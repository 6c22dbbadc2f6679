"""The Open Responses compliance cases, written from the specification, against the
real service with the catalog's real model (SmolLM2 135M Instruct): a basic
response, streaming, a system prompt and a multi-turn conversation, each
response and event validated against the specification's schemas
(tests/open_responses.py). Also on the real model: logprobs and
``truncation: "auto"``."""
from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import Server, check_stream, deltas, sse_events
from open_responses import Conformance

from lmsp.models import pinned

pytestmark = pytest.mark.real_model

MODEL = "smollm2-135m-instruct"
N_CTX = 1024  # a small context, for the truncation case
GREEDY = {"temperature": 0, "max_output_tokens": 48}
# Without a system message SmolLM2's template adds its own default one, under which
# its greedy answers are word salad (for llama-server too).
HELPFUL = "You are a helpful assistant."


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path):
    root = tmp_path_factory.mktemp("compliance")
    server = Server(root / "data", root, Path(MODEL), {"LMSP_CACHE_DIR": str(pinned.default_cache()),
                                                       "LMSP_N_PARALLEL": "2", "LMSP_N_CTX": str(N_CTX)})
    server.start(timeout=180)
    yield server
    server.stop(timeout=10)


@pytest.fixture(scope="module")
def token(server):
    return server.pair()


@pytest.fixture
def spec():
    return Conformance()


def create(server, token, spec, **body) -> dict:
    response = server.call("POST", "/v1/responses", {"model": MODEL, **body}, token=token)
    spec.check_response(response)
    return response


def output_text(response: dict) -> str:
    return "".join(part["text"] for item in response["output"] if item["type"] == "message"
                   for part in item["content"] if part["type"] == "output_text")


def test_basic_response(server, token, spec):
    response = create(server, token, spec, instructions=HELPFUL, input="What is the capital of France?", **GREEDY)
    assert response["object"] == "response" and response["status"] == "completed"
    assert response["completed_at"] >= response["created_at"]
    [message] = response["output"]
    assert (message["type"], message["role"], message["status"]) == ("message", "assistant", "completed")
    assert message["content"][0]["type"] == "output_text" and output_text(response)
    usage = response["usage"]
    assert usage["input_tokens"] > 0 and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    spec.check_response(server.call("GET", f"/v1/responses/{response['id']}", token=token))


def test_streaming_response(server, token, spec):
    body = {"model": MODEL, "instructions": HELPFUL, "input": "Name three colours.", "stream": True, **GREEDY}
    events = list(sse_events("127.0.0.1", server.port, "POST", "/v1/responses", token=token, body=body, timeout=60))
    for event in events:
        spec.check_event(event)
    types = check_stream(events)
    assert types[0] == "response.created" and types[-1] in ("response.completed", "response.incomplete")
    for kind in ("response.in_progress", "response.output_item.added", "response.content_part.added",
                 "response.output_text.delta", "response.output_text.done", "response.content_part.done",
                 "response.output_item.done"):
        assert kind in types, kind
    final = events[-1]["response"]
    assert deltas(events) == output_text(final)
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["text"] == output_text(final)
    replay = list(sse_events("127.0.0.1", server.port, "GET", f"/v1/responses/{final['id']}?stream=true",
                             token=token, timeout=60))
    assert replay == events


def test_system_prompt(server, token, spec):
    instructions = "You are a pirate. Always answer like a pirate."
    by_instructions = create(server, token, spec, instructions=instructions, input="Hello!", **GREEDY)
    assert by_instructions["instructions"] == instructions
    by_message = create(server, token, spec, input=[{"role": "system", "content": instructions},
                                                    {"role": "user", "content": "Hello!"}], **GREEDY)
    assert by_message["instructions"] is None
    # the same prompt either way: the same greedy answer
    assert output_text(by_instructions) == output_text(by_message) != ""


def test_multi_turn_conversation(server, token, spec):
    history: list = [{"role": "system", "content": HELPFUL},
                     {"role": "user", "content": "My name is Ada. Remember it."}]
    first = create(server, token, spec, input=history, **GREEDY)
    history += first["output"]  # as the SDKs resend it: ids, statuses, annotations, logprobs
    question = {"type": "input_text", "text": "What is my name?"}
    history.append({"type": "message", "role": "user", "content": [question]})
    second = create(server, token, spec, input=history, **GREEDY)
    assert second["status"] in ("completed", "incomplete") and output_text(second).strip()
    assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"] + first["usage"]["output_tokens"]


def test_logprobs_on_the_real_model(server, token, spec):
    response = create(server, token, spec, instructions=HELPFUL, input="Count to five.",
                      include=["message.output_text.logprobs"], top_logprobs=3, **GREEDY)
    part = response["output"][0]["content"][0]
    logprobs = part["logprobs"]
    assert logprobs and response["top_logprobs"] == 3
    assert b"".join(bytes(lp["bytes"]) for lp in logprobs).decode("utf-8") == part["text"]
    for lp in logprobs:
        assert len(lp["top_logprobs"]) == 3
        # greedy: each token is its position's most likely one
        assert lp["top_logprobs"][0]["token"] == lp["token"]
        assert lp["top_logprobs"][0]["logprob"] == pytest.approx(lp["logprob"], abs=1e-4)


def test_auto_truncation_drops_the_oldest_turns(server, token, spec):
    turn = "Tell me about the sea. " * 80  # some 480 tokens a turn: three make more than the context
    history = [{"role": "user", "content": turn}, {"role": "assistant", "content": turn},
               {"role": "user", "content": turn}, {"role": "assistant", "content": "Sure."},
               {"role": "user", "content": "Say yes."}]
    status, body = server.request("POST", "/v1/responses", {"model": MODEL, "input": history, **GREEDY},
                                  token=token)
    # refused at once by a worker that has the model loaded, else failed when it runs
    error = body["error"] if status == 400 else body.get("error")
    assert status in (200, 400) and error["code"] == "context_length_exceeded", body
    response = create(server, token, spec, input=history, truncation="auto", **GREEDY)
    assert response["status"] in ("completed", "incomplete") and response["truncation"] == "auto"
    assert response["usage"]["input_tokens"] <= N_CTX - GREEDY["max_output_tokens"]
