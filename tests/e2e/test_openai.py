"""The official ``openai`` package, unmodified, as a client of the real service."""
from __future__ import annotations

import re
import shutil
import time

import openai
import pytest


@pytest.fixture(scope="module")
def client(served, served_token):
    with openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=served_token, timeout=60.0,
                       max_retries=0) as c:
        yield c


def wait_status(client, response_id, statuses, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        response = client.responses.retrieve(response_id)
        if response.status in statuses:
            return response
        assert time.monotonic() < deadline, f"response {response_id} stuck in {response.status}"
        time.sleep(0.05)


def test_plain_create(client):
    response = client.responses.create(model="tiny", input="Hello there", max_output_tokens=8, temperature=0)
    assert response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete")
    assert response.output_text
    assert 0 < response.usage.output_tokens <= 8
    again = client.responses.retrieve(response.id)
    assert again.output_text == response.output_text


def test_streamed_create(client):
    stream = client.responses.create(model="tiny", input=[{"role": "user", "content": "Tell me a story"}],
                                     instructions="Be brief.", max_output_tokens=12, stream=True)
    events = list(stream)
    types = [e.type for e in events]
    assert types[0] == "response.created"
    assert types[-1] in ("response.completed", "response.incomplete")
    numbers = [e.sequence_number for e in events]
    assert numbers[0] == 1 and numbers == sorted(set(numbers))  # the log's, less its task.* events
    assert not [t for t in types if t.startswith("task.")]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and events[-1].response.output_text == text


def test_background_retrieve_and_cancel(client):
    response = client.responses.create(model="tiny", input="Count on:", max_output_tokens=1500, background=True,
                                       temperature=0)
    assert response.status == "queued"
    assert response.background is True
    wait_status(client, response.id, ("in_progress",))
    cancelled = client.responses.cancel(response.id)
    assert cancelled.id == response.id
    assert cancelled.status in ("in_progress", "cancelled")  # cancelling until the engine's next step
    final = wait_status(client, response.id, ("cancelled", "completed", "incomplete", "failed"))
    assert final.status == "cancelled"


def test_background_then_stream_resume_with_starting_after(client):
    response = client.responses.create(model="tiny", input="Once upon a time", max_output_tokens=20,
                                       background=True, temperature=0)
    final = wait_status(client, response.id, ("completed", "incomplete"))
    events = list(client.responses.retrieve(response.id, stream=True, starting_after=3))
    numbers = [e.sequence_number for e in events]
    assert numbers[0] > 3 and numbers == sorted(set(numbers))
    assert events[-1].type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text


def test_models_list(client):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert "tiny" in ids
    tiny = next(m for m in models.data if m.id == "tiny")
    assert tiny.owned_by == "local"


def test_a_flat_distribution_with_top_p_near_one_completes(client, served):
    """Temperature 2, top-k 3 and a top_p close to 1: the probability mass is reached only at the
    last candidate, where the engine's sampler once looped forever and took the worker with it."""
    response = client.responses.create(model="tiny", input="Roll the dice", max_output_tokens=8,
                                       temperature=2.0, top_p=0.9999, extra_body={"top_k": 3, "seed": 11})
    assert response.status in ("completed", "incomplete")
    assert 0 < response.usage.output_tokens <= 8
    after = client.responses.create(model="tiny", input="Still there?", max_output_tokens=4, temperature=0)
    assert after.status in ("completed", "incomplete")


def test_the_next_turn_of_a_conversation_reports_its_cached_tokens(client):
    # a prompt of 64 tokens or more from the first turn on: the engine prefills
    # those tiled, shorter ones row by row, and builds on rows of one kind only
    question = [{"role": "system", "content": "You answer in one word. " + "Be brief, plain and exact. " * 12},
                {"role": "user", "content": "Name a river."}]
    first = client.responses.create(model="tiny", input=question, max_output_tokens=6, temperature=0)
    turn = question + [{"role": "assistant", "content": first.output_text},
                       {"role": "user", "content": "And a lake?"}]
    second = client.responses.create(model="tiny", input=turn, max_output_tokens=6, temperature=0)
    cached = second.usage.input_tokens_details.cached_tokens
    # at least the system message and the first question came from the cache
    assert 0 < cached < second.usage.input_tokens
    assert second.usage.output_tokens_details.reasoning_tokens == 0
    assert second.usage.total_tokens == second.usage.input_tokens + second.usage.output_tokens


def test_metrics_count_the_engine_steps_and_passes(client, served):
    client.responses.create(model="tiny", input="Hello there", max_output_tokens=4, temperature=0)
    text = served.call("GET", "/metrics")
    steps = re.search(r'^lmsp_engine_steps_total\{model="tiny"\} (\d+)$', text, re.M)
    passes = re.search(r'^lmsp_engine_ubatches_total\{model="tiny"\} (\d+)$', text, re.M)
    fillers = re.search(r'^lmsp_engine_filler_rows_total\{model="tiny"\} (\d+)$', text, re.M)
    assert steps and passes and fillers, text
    assert int(passes[1]) >= int(steps[1]) > 0
    assert int(fillers[1]) >= 0


def test_a_failed_stream_ends_with_its_failed_event(client, served):
    """A file changed in place (same size) fails its task at load: the stream ends with a
    ResponseFailedEvent carrying response.error (B.6), and the response is retrieved."""
    edited = served.data_dir / "edited.gguf"
    shutil.copyfile(served.model, edited)
    served.operator("models", "add", str(edited), "--id", "edited")
    with open(edited, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0xFF]))
    events = list(client.responses.create(model="edited", input="Hi", max_output_tokens=4, stream=True))
    failed = events[-1]
    assert isinstance(failed, openai.types.responses.ResponseFailedEvent), [e.type for e in events]
    assert failed.response.status == "failed" and failed.response.error.code == "model_changed"
    retrieved = client.responses.retrieve(failed.response.id)
    assert retrieved.status == "failed" and retrieved.error.code == "model_changed"
    replayed = list(client.responses.retrieve(failed.response.id, stream=True, starting_after=0))
    assert isinstance(replayed[-1], openai.types.responses.ResponseFailedEvent)


def test_what_clients_send_is_taken_and_the_history_resent(client):
    """The fields frameworks send that ask for nothing, logprobs as the package types
    them, and ``input = history + response.output`` with the package's own objects."""
    history: list = [{"role": "user", "content": "Hello there"}]
    first = client.responses.create(
        model="tiny", input=history, max_output_tokens=8, temperature=0, include=["message.output_text.logprobs"],
        top_logprobs=2, truncation="auto", tools=[], tool_choice="none", parallel_tool_calls=True, store=True,
        service_tier="auto", user="u", safety_identifier="s", prompt_cache_key="k", reasoning={"effort": "low"},
        text={"format": {"type": "text"}}, metadata={"app": "test"})
    assert first.truncation == "auto" and first.tool_choice == "none" and first.prompt_cache_key == "k"
    part = first.output[0].content[0]
    assert part.logprobs and all(len(lp.top_logprobs) == 2 for lp in part.logprobs)
    assert "".join(lp.token for lp in part.logprobs) == part.text
    stream = client.responses.create(model="tiny", input=history, max_output_tokens=8, temperature=0,
                                     include=["message.output_text.logprobs"], stream=True)
    streamed = [lp for e in stream if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert [lp.token for lp in streamed] == [lp.token for lp in part.logprobs]
    again = client.responses.create(model="tiny", input=[*history, *first.output,
                                                         {"role": "user", "content": "And then?"}],
                                    max_output_tokens=4)
    assert again.status in ("completed", "incomplete")
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", input="Hi", tools=[{"type": "web_search"}])
    assert refused.value.body["param"] == "tools[0].type"
