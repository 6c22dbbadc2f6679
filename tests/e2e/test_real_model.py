"""A real model end to end: ``lmsp serve --model smollm2-135m-instruct`` (a catalog name,
pulled from the cache into the data directory at start) answers in English, and its
streamed, stopped and capped answers agree with its plain one. Short outputs only."""
from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import (
    FINISHED,
    Server,
    check_log,
    check_stream,
    deltas,
    resumed_text,
    sse_events,
    start_running,
    uninterrupted_text,
)

from lmsp.models import pinned

pytestmark = pytest.mark.real_model

MODEL = "smollm2-135m-instruct"
QUESTION = "What is the capital of France?"
# Without a system message SmolLM2's template adds its own default one, and the
# greedy answer to QUESTION under it is French word salad, for llama-server too.
INSTRUCTIONS = "You are a helpful assistant."


# a greedy request whose answer runs to max_output_tokens
STORY = {"model": MODEL, "instructions": INSTRUCTIONS, "input": "Write a long story about a lighthouse keeper.",
         "temperature": 0, "max_output_tokens": 200}


def real_server(root: Path, **env: str) -> Server:
    """``lmsp serve --model smollm2-135m-instruct`` on a data directory under root (not started)."""
    return Server(root / "data", root, Path(MODEL), {"LMSP_CACHE_DIR": str(pinned.default_cache()),
                                                     "LMSP_N_PARALLEL": "2", **env})


def smollm2_fixtures(label: str):
    """A module's ``server`` (SmolLM2 served for the whole module, its data under a
    directory named ``label``) and ``token`` (a paired client's) fixtures."""

    @pytest.fixture(scope="module")
    def server(tmp_path_factory, smollm2_path):
        served = real_server(tmp_path_factory.mktemp(label))
        served.start(timeout=180)
        yield served
        served.stop(timeout=10)

    @pytest.fixture(scope="module")
    def token(server):
        return server.pair()

    return server, token


server, token = smollm2_fixtures("real")


def answer(server, token, **body) -> dict:
    return server.call("POST", "/v1/responses", {"model": MODEL, **body}, token=token)


def text_of(response: dict) -> str:
    return "".join(part["text"] for item in response["output"] for part in item["content"])


def test_the_catalog_name_is_pulled_into_the_data_directory_and_registered(server, smollm2_path):
    copy = server.data_dir / "models" / f"{MODEL}.gguf"
    assert copy.stat().st_size == smollm2_path.stat().st_size
    model = server.call("GET", f"/v1/models/{MODEL}", token=server.pair("models:read"))
    assert (model["architecture"], model["quantization"]) == ("llama", "Q4_1")


def test_a_greedy_answer_ignores_the_sampler_s_settings(server, token):
    greedy = dict(instructions=INSTRUCTIONS, input=QUESTION, temperature=0, max_output_tokens=16)
    response = answer(server, token, **greedy)
    assert response["status"] == "completed" and text_of(response)
    # greedy takes the likeliest token: neither the seed nor top_p can change it
    assert text_of(answer(server, token, **greedy, seed=99, top_p=0.5)) == text_of(response)


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
    word = full.split()[-1]  # a stop string the greedy answer holds, whatever it says on this CPU
    stopped = answer(server, token, **greedy, stop=[word])
    assert stopped["status"] == "completed"
    assert text_of(stopped) == full[:full.index(word)]


def test_max_output_tokens_caps_the_answer(server, token):
    capped = answer(server, token, instructions=INSTRUCTIONS, input=QUESTION, temperature=0, max_output_tokens=3)
    assert capped["status"] == "incomplete"
    assert capped["incomplete_details"] == {"reason": "max_output_tokens"}
    assert capped["usage"]["output_tokens"] == 3
    full = text_of(answer(server, token, instructions=INSTRUCTIONS, input=QUESTION, temperature=0,
                          max_output_tokens=16))
    assert full.startswith(text_of(capped)) and len(text_of(capped)) < len(full)


@pytest.fixture(scope="module")
def story(server, token) -> str:
    """The uninterrupted greedy answer to STORY on one worker."""
    text = uninterrupted_text(server, token, STORY)
    assert len(text) > 400  # long enough to be interrupted part way
    return text


def test_a_story_cancelled_mid_stream_ends_cancelled_with_a_prefix_of_the_greedy_answer(server, token, story):
    events, seen = [], 0
    for event in sse_events("127.0.0.1", server.port, "POST", "/v1/responses", token=token,
                            body={**STORY, "stream": True}, timeout=60):
        events.append(event)
        seen += event["type"] == "response.output_text.delta"
        if seen == 5 and event["type"] == "response.output_text.delta":
            server.call("POST", f"/v1/responses/{events[0]['response']['id']}/cancel", token=token)
    assert check_stream(events)[-1] == "response.cancelled"
    response = events[-1]["response"]
    assert response["status"] == "cancelled"
    text = deltas(events)
    assert text_of(response) == text
    assert 0 < len(text) < len(story) and story.startswith(text)


@pytest.mark.slow  # a real service, crash or wait: seconds each on 2 cores
def test_a_resume_story_killed_mid_generation_continues_to_the_greedy_answer(tmp_path, smollm2_path, story):
    crashed = real_server(tmp_path)
    try:
        crashed.start(timeout=180)
        token = crashed.pair()
        [task_id] = start_running(crashed, token, STORY, ["resume"]).values()
        before = deltas(crashed.events(token, task_id))
        crashed.kill()  # the master and its worker, SIGKILL
        crashed.start(timeout=180)
        assert resumed_text(crashed, token, task_id, before) == story
    finally:
        crashed.stop(timeout=10)


@pytest.mark.slow  # a real service, crash or wait: seconds each on 2 cores
def test_two_workers_answer_concurrent_greedy_requests_as_one_worker_does(tmp_path, server, token):
    inputs = [QUESTION, "Name three colours.", "Describe the sea in two sentences."]
    body = {"model": MODEL, "instructions": INSTRUCTIONS, "temperature": 0, "max_output_tokens": 40}
    single = {text: uninterrupted_text(server, token, {**body, "input": text}) for text in inputs}
    pair = real_server(tmp_path, LMSP_WORKERS="2")
    try:
        pair.start(timeout=180)
        assert len(pair.workers()) == 2
        pair_token = pair.pair()
        created = {text: [pair.call("POST", "/v1/responses", {**body, "input": text, "background": True},
                                    token=pair_token, expect=202) for _ in range(2)] for text in inputs}
        for text, responses in created.items():
            for response in responses:
                task_id = response["task"]["id"]
                task = pair.wait_task(pair_token, task_id, lambda t: t["status"] in FINISHED, timeout=180)
                assert task["status"] == "completed" and task["attempts"] == 1
                assert check_log(pair.events(pair_token, task_id)).count("task.running") == 1
                answer = pair.call("GET", f"/v1/responses/{response['id']}", token=pair_token)
                assert text_of(answer) == single[text], text
    finally:
        pair.stop(timeout=10)
