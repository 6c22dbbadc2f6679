"""A real model end to end: ``lmsp serve --model smollm2-135m-instruct`` (a catalog name,
pulled from the cache into the data directory at start) answers in English, and its
streamed, stopped and capped answers agree with its plain one. Short outputs only."""
from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import Server, deltas, sse_events

from lmsp import pinned

pytestmark = pytest.mark.real_model

MODEL = "smollm2-135m-instruct"
QUESTION = "What is the capital of France?"
# Without a system message SmolLM2's template adds its own default one, and the
# greedy answer to QUESTION under it is French word salad, for llama-server too.
INSTRUCTIONS = "You are a helpful assistant."


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path):
    root = tmp_path_factory.mktemp("real")
    server = Server(root / "data", root, Path(MODEL), {"LMSP_CACHE_DIR": str(pinned.default_cache()),
                                                       "LMSP_N_PARALLEL": "2"})
    server.start(timeout=180)
    yield server
    server.stop(timeout=10)


@pytest.fixture(scope="module")
def token(server):
    return server.pair()


def answer(server, token, **body) -> dict:
    return server.call("POST", "/v1/responses", {"model": MODEL, **body}, token=token)


def text_of(response: dict) -> str:
    return "".join(part["text"] for item in response["output"] for part in item["content"])


def test_the_catalog_name_is_pulled_into_the_data_directory_and_registered(server, smollm2_path):
    copy = server.data_dir / "models" / f"{MODEL}.gguf"
    assert copy.stat().st_size == smollm2_path.stat().st_size
    model = server.call("GET", f"/v1/models/{MODEL}", token=server.pair("models:read"))
    assert (model["architecture"], model["quantization"]) == ("llama", "Q4_1")


def test_a_greedy_answer_names_the_capital_of_france(server, token):
    response = answer(server, token, instructions=INSTRUCTIONS, input=QUESTION, temperature=0,
                      max_output_tokens=16)
    assert response["status"] == "completed"
    assert "Paris" in text_of(response)


def test_streamed_deltas_make_the_plain_answer_for_the_same_seed(server, token):
    body = {"model": MODEL, "input": "Name three colours.", "seed": 11, "max_output_tokens": 24}
    plain = text_of(answer(server, token, **{k: v for k, v in body.items() if k != "model"}))
    events = list(sse_events("127.0.0.1", server.port, "POST", "/v1/responses", token=token,
                             body={**body, "stream": True}, timeout=60))
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    assert plain and deltas(events) == plain
    assert text_of(events[-1]["response"]) == plain


def test_a_stop_string_ends_the_answer_before_it(server, token):
    greedy = dict(instructions=INSTRUCTIONS, input=QUESTION, temperature=0, max_output_tokens=16)
    full = text_of(answer(server, token, **greedy))
    assert "Paris" in full
    stopped = answer(server, token, **greedy, stop=["Paris"])
    assert stopped["status"] == "completed"
    assert text_of(stopped) == full[:full.index("Paris")]


def test_max_output_tokens_caps_the_answer(server, token):
    capped = answer(server, token, instructions=INSTRUCTIONS, input=QUESTION, temperature=0, max_output_tokens=3)
    assert capped["status"] == "incomplete"
    assert capped["incomplete_details"] == {"reason": "max_output_tokens"}
    assert capped["usage"]["output_tokens"] == 3
    full = text_of(answer(server, token, instructions=INSTRUCTIONS, input=QUESTION, temperature=0,
                          max_output_tokens=16))
    assert full.startswith(text_of(capped)) and len(text_of(capped)) < len(full)
