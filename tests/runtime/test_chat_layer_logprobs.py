"""Log probabilities of tasks on llama.cpp's chat layer, on the real store and
engine (demo models whose templates know tools or think): the message's
tokens carry them, on its deltas, its done events and the stored Response;
the reasoning carries none; a resumed task gives what an uninterrupted one
gives."""
from __future__ import annotations

from runtime_helpers import all_events, check_log, submit, wait_finished
from test_chat_layer_tasks import WEATHER, chat_models, conforms, crash_and_resume, response_of, start  # noqa: F401

from lmsp.items import chat as ci
from lmsp.objects import LOGPROBS

ASK = {"include": [LOGPROBS], "top_logprobs": 2}


def message_logprobs(store, task_id) -> tuple[dict, list[dict]]:
    """The Response's message and its text's deltas' entries, checked against the
    message's done events."""
    events = all_events(store, task_id)
    check_log(events)
    conforms(store, task_id, events)
    [message] = [i for i in response_of(store, task_id)["output"] if i["type"] == "message"]
    deltas = [e for ev in events if ev["type"] == ci.TEXT_DELTA for e in ev["logprobs"]]
    [done] = [ev for ev in events if ev["type"] == ci.TEXT_DONE]
    [part] = [ev["part"] for ev in events if ev["type"] == ci.PART_DONE]
    assert done["logprobs"] == part["logprobs"] == message["content"][0]["logprobs"] == deltas
    return message, deltas


def test_the_message_s_tokens_carry_them(store, make_runtime, chat_models):  # noqa: F811
    rt = start(make_runtime, store)
    task_id = submit(store, rt, "Weather in Paris?", model="tools", tools=[WEATHER], tool_choice="auto",
                     max_output_tokens=10, **ASK)
    wait_finished(rt, store, task_id)
    message, entries = message_logprobs(store, task_id)
    text = message["content"][0]["text"]
    assert entries and all(len(e["top_logprobs"]) == 2 for e in entries)
    # greedy: each token is its position's likeliest
    assert all(e["top_logprobs"][0]["token"] == e["token"] for e in entries)
    assert text in bytes(b for e in entries for b in e["bytes"]).decode("utf-8", errors="replace")


def test_a_model_that_may_think_but_does_not(store, make_runtime, chat_models):  # noqa: F811
    rt = start(make_runtime, store)
    task_id = submit(store, rt, "Weather in Paris?", model="think", max_output_tokens=6,
                     reasoning={"effort": "none", "summary": None}, **ASK)
    wait_finished(rt, store, task_id)
    assert message_logprobs(store, task_id)[1]


def test_the_reasoning_carries_none(store, make_runtime, chat_models):  # noqa: F811
    rt = start(make_runtime, store)
    task_id = submit(store, rt, "Weather in Paris?", model="think", max_output_tokens=12,
                     reasoning={"effort": "high", "summary": None}, **ASK)
    wait_finished(rt, store, task_id)
    events = all_events(store, task_id)
    conforms(store, task_id, events)
    assert [i["type"] for i in response_of(store, task_id)["output"]] == ["reasoning"]
    assert not any("logprobs" in ev for ev in events if ev["type"] in (ci.REASONING_DELTA, ci.REASONING_DONE))


def test_a_resumed_task_gives_what_an_uninterrupted_one_gives(config, store, make_runtime, chat_models):  # noqa: F811
    resumed, reference, events = crash_and_resume(config, store, make_runtime, "tools", min_seq=12,
                                                  max_output_tokens=60, tools=[WEATHER], tool_choice="auto", **ASK)
    [message] = resumed["output"]
    [ref] = reference["output"]
    assert message["content"][0]["logprobs"] and message["content"] == ref["content"]
