"""Tasks on llama.cpp's chat layer, on the real store and engine: demo models
whose templates know tools or think (tests/chat_templates.py). A call made in
the model's own format, reasoning in its own item, both committed as events
and read back as the Response's items; a resume mid-call or mid-reasoning
continues exactly."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from runtime_helpers import all_events, check_log, submit, wait_finished, wait_until

from lmsp.items import chat as ci
from lmsp.contracts import NewTask
from lmsp.errors import ContextLengthExceeded
from lmsp.models.demo import write_demo_model
from lmsp.runtime import chat_layer, open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chat_templates import THINK_TEMPLATE, TOOLS_TEMPLATE  # noqa: E402
from open_responses import Conformance  # noqa: E402

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1,
                                                                                     "maximum": 9}},
    "required": ["city", "days"], "additionalProperties": False}}  # fmt: skip
NOTE = {"type": "function", "name": "note", "description": "Take a note", "strict": True, "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}  # fmt: skip


@pytest.fixture
def chat_models(config):
    write_demo_model(config.models_dir / "tools.gguf", chat_template=TOOLS_TEMPLATE)
    write_demo_model(config.models_dir / "think.gguf", chat_template=THINK_TEMPLATE)


def start(make_runtime, store):
    rt = make_runtime(store)
    rt.register_model("tools.gguf")
    rt.register_model("think.gguf")
    return rt


def response_of(store, task_id):
    return store.get_response(store.get_task(task_id)["response_id"])


def conforms(store, task_id, events) -> None:
    """The task's log and Response pass the Open Responses schemas (open_responses.py)."""
    check = Conformance()
    for event in events:
        check.check_event(event, in_log=True)
    check.check_response(response_of(store, task_id))


def test_a_required_call_in_the_models_own_format(store, make_runtime, chat_models):
    rt = start(make_runtime, store)
    task_id = submit(store, rt, "Weather in Paris?", model="tools", tools=[WEATHER], tool_choice="required",
                     parallel_tool_calls=False, max_output_tokens=200, temperature=1.0, seed=5)
    assert wait_finished(rt, store, task_id)["status"] == "completed"
    events = all_events(store, task_id)
    types = check_log(events)
    shown = [t for t in types if t.startswith("response.") and t not in ("response.created", "response.queued",
                                                                         "response.in_progress")]
    assert shown[0] == ci.ADDED and shown[-3:] == [ci.ARGS_DONE, ci.ITEM_DONE, "response.completed"]
    assert set(shown[1:-3]) == {ci.ARGS_DELTA}
    out = response_of(store, task_id)
    (call,) = out["output"]
    assert call["type"] == "function_call" and call["name"] == "get_weather" and call["status"] == "completed"
    assert call["arguments"] == "".join(e["delta"] for e in events if e["type"] == ci.ARGS_DELTA)
    args = json.loads(call["arguments"])
    assert args["city"] in ("Paris", "Rome") and 1 <= args["days"] <= 9
    assert events[-1]["response"]["output"] == out["output"]  # the stored response is the streamed one
    assert out["reasoning"] == {"effort": None, "summary": None}  # this model does not think
    conforms(store, task_id, events)


def test_the_model_thinks_in_a_reasoning_item(store, make_runtime, chat_models):
    rt = start(make_runtime, store)
    task_id = submit(store, rt, "Weather in Paris?", model="think", max_output_tokens=12,
                     reasoning={"effort": "high", "summary": None})
    assert wait_finished(rt, store, task_id)["status"] == "completed"
    events = all_events(store, task_id)
    check_log(events)
    out = response_of(store, task_id)
    (item,) = out["output"]  # a random model never closes its thinking
    assert item["type"] == "reasoning" and item["id"].startswith("rs_")
    text = "".join(e["delta"] for e in events if e["type"] == ci.REASONING_DELTA)
    assert text and item["content"] == [{"type": "reasoning_text", "text": text}]
    done = [e for e in events if e["type"] == ci.REASONING_DONE]
    assert len(done) == 1 and done[0]["text"] == text
    usage = out["usage"]
    assert 0 < usage["output_tokens_details"]["reasoning_tokens"] <= usage["output_tokens"] == 12
    assert out["status"] == "incomplete" and out["reasoning"]["effort"] == "high"
    conforms(store, task_id, events)


def test_effort_none_is_the_templates_thinking_switch(store, make_runtime, chat_models):
    rt = start(make_runtime, store)
    task_id = submit(store, rt, "Weather in Paris?", model="think", max_output_tokens=6,
                     reasoning={"effort": "none", "summary": None})
    wait_finished(rt, store, task_id)
    out = response_of(store, task_id)
    assert [i["type"] for i in out["output"]] == ["message"]
    assert out["usage"]["output_tokens_details"]["reasoning_tokens"] == 0
    conforms(store, task_id, all_events(store, task_id))


def crash_at(store, rt, min_seq: int) -> None:
    """The worker's commits stop once a task of theirs reached ``min_seq`` events: they
    wait for the abort, then fail as a dead worker's would (the task cannot finish
    before the crash, however slow the test's own thread)."""
    real = store.append_step

    def append_step(owner, items, **kwargs):
        if any(store.get_task(item["task_id"])["last_sequence_number"] >= min_seq for item in items):
            while not rt.state.aborted:
                time.sleep(0.01)
            raise OSError("the worker died")
        return real(owner, items, **kwargs)

    store.append_step = append_step


def crash_and_resume(config, store, make_runtime, model, *, min_seq, **request):
    rt = start(make_runtime, store)
    crash_at(store, rt, min_seq)
    task_id = submit(store, rt, "Weather in Paris?", model=model, on_restart="resume", **request)
    wait_until(rt, store, task_id, lambda t: t["last_sequence_number"] >= min_seq)
    rt.abort()
    before = all_events(store, task_id)
    restarted = open_store(config)
    rt2 = None
    try:
        assert restarted.recover(startup=True)["resumed"] == [task_id]
        rt2 = start(make_runtime, restarted)
        assert wait_finished(rt2, restarted, task_id)["status"] == "completed"
        after = all_events(restarted, task_id)
        check_log(after)
        assert after[: len(before)] == before
        reference = submit(restarted, rt2, "Weather in Paris?", model=model, **request)
        wait_finished(rt2, restarted, reference)
        return response_of(restarted, task_id), response_of(restarted, reference), after
    finally:
        if rt2 is not None:
            rt2.stop()
        restarted.close()


def test_a_resume_inside_the_reasoning_continues_exactly(config, store, make_runtime, chat_models):
    resumed, reference, events = crash_and_resume(config, store, make_runtime, "think", min_seq=12,
                                                  max_output_tokens=400)
    assert resumed["output"] == [{**item, "id": resumed["output"][0]["id"]} for item in reference["output"]]
    assert [e["type"] for e in events].count(ci.ADDED) == 1


def test_a_resume_inside_a_calls_arguments_continues_exactly(config, store, make_runtime, chat_models):
    resumed, reference, events = crash_and_resume(config, store, make_runtime, "tools", min_seq=12,
                                                  max_output_tokens=400, tools=[NOTE], tool_choice="required")
    (call,) = resumed["output"]
    (ref,) = reference["output"]
    assert call["name"] == "note" and call["arguments"] == ref["arguments"] and len(call["arguments"]) > 20
    assert [e["type"] for e in events].count(ci.ADDED) == 1


def new_task(request: dict) -> NewTask:
    return NewTask(client_id=None, model=request["model"], messages=[{"role": "user", "content": "Hi"}],
                   request=request, on_restart="fail", background=True, stream=False)


def test_a_cancel_inside_the_reasoning_ends_its_item(store, make_runtime, chat_models):
    rt = start(make_runtime, store)
    task_id = submit(store, rt, "Weather in Paris?", model="think", max_output_tokens=1500)
    wait_until(rt, store, task_id, lambda t: t["last_sequence_number"] >= 8)
    store.cancel(task_id)
    rt.notify_cancel(task_id)
    assert wait_finished(rt, store, task_id)["status"] == "cancelled"
    events = all_events(store, task_id)
    types = check_log(events)
    assert types[-3:] == [ci.REASONING_DONE, ci.ITEM_DONE, "response.cancelled"]
    text = "".join(e["delta"] for e in events if e["type"] == ci.REASONING_DELTA)
    assert events[-3]["text"] == text and response_of(store, task_id)["output"][0]["content"][0]["text"] == text
    conforms(store, task_id, events)


def test_auto_lets_the_model_answer_in_text(store, make_runtime, chat_models):
    rt = start(make_runtime, store)
    task_id = submit(store, rt, "Weather in Paris?", model="tools", tools=[WEATHER], tool_choice="auto",
                     max_output_tokens=10)
    wait_finished(rt, store, task_id)
    events = all_events(store, task_id)
    types = check_log(events)
    out = response_of(store, task_id)
    # a random model does not write the call marker that starts the lazy grammar
    [message] = out["output"]
    text = "".join(e["delta"] for e in events if e["type"] == ci.TEXT_DELTA)
    assert message["type"] == "message" and message["content"][0]["text"] == text and text
    assert types.count(ci.PART_ADDED) == 1 and types.count(ci.TEXT_DONE) == 1
    assert all(e["item_id"] == message["id"] and e["output_index"] == 0 for e in events if e["type"] == ci.TEXT_DELTA)
    conforms(store, task_id, events)


def test_a_retry_starts_the_items_again(config, store, make_runtime, chat_models):
    rt = start(make_runtime, store)
    # long enough that the abort comes before its end, however the commits group its tokens
    task_id = submit(store, rt, "Weather in Paris?", model="think", on_restart="retry", max_output_tokens=600)
    wait_until(rt, store, task_id, lambda t: t["last_sequence_number"] >= 8)
    rt.abort()
    restarted = open_store(config)
    rt2 = None
    try:
        assert restarted.recover(startup=True)["requeued"] == [task_id]
        rt2 = start(make_runtime, restarted)
        assert wait_finished(rt2, restarted, task_id)["status"] == "completed"
        events = all_events(restarted, task_id)
        types = check_log(events)
        again = types[types.index("task.requeued"):]
        [item] = response_of(restarted, task_id)["output"]
        text = "".join(e["delta"] for e in events[len(types) - len(again):] if e["type"] == ci.REASONING_DELTA)
        assert again.count(ci.ADDED) == 1 and item["content"][0]["text"] == text
        conforms(restarted, task_id, events)
    finally:
        if rt2 is not None:
            rt2.stop()
        restarted.close()


def test_a_created_task_runs_the_chat_layers_prompt(store, make_runtime, chat_models, config):
    rt = start(make_runtime, store)
    rt.load_model("tools")
    request = {"model": "tools", "input": "Weather in Paris?", "tools": [WEATHER], "tool_choice": "required",
               "max_output_tokens": 60, "temperature": 0.0}
    created = rt.create_task(new_task(request))  # checked, and rendered once, by the service's own format
    task_id = created["task"]["id"]
    wait_finished(rt, store, task_id)
    engine = rt.registry.engine("tools")
    expected = chat_layer.plan(engine, store.get_request(store.get_task(task_id)["response_id"]))
    assert response_of(store, task_id)["usage"]["input_tokens"] == len(expected.tokens)
    assert [i["type"] for i in response_of(store, task_id)["output"]] == ["function_call"]


def test_a_prompt_longer_than_the_context_is_refused_at_creation(store, make_runtime, chat_models):
    rt = start(make_runtime, store)
    rt.load_model("tools")
    with pytest.raises(ContextLengthExceeded):
        rt.create_task(new_task({"model": "tools", "input": "word " * 3000, "tools": [WEATHER]}))


def test_a_history_with_calls_runs_on_the_chat_layer_without_tools(store, make_runtime, chat_models):
    rt = start(make_runtime, store)
    call = {"role": "assistant", "content": "", "call_id": "call_1", "name": "get_weather",
            "arguments": '{"city": "Paris", "days": 1}'}  # fmt: skip
    output = {"role": "user", "content": "", "call_id": "call_1", "output": "Sunny"}
    task_id = submit(store, rt, [{"role": "user", "content": "Weather?"}, call, output], model="tools",
                     max_output_tokens=8)  # fmt: skip
    assert wait_finished(rt, store, task_id)["status"] in ("completed", "incomplete")
    engine = rt.registry.engine("tools")
    request = store.get_request(store.get_task(task_id)["response_id"])
    expected = chat_layer.plan(engine, request)
    assert expected is not None and response_of(store, task_id)["usage"]["input_tokens"] == len(expected.tokens)
    assert [i["type"] for i in response_of(store, task_id)["output"]] == ["message"]
