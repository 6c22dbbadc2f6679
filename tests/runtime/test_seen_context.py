"""A conversation's context kept by value, cut at the admission to what the truncated
prompt holds: the task stores no more than the model sees, and its stored request
renders the same prompt again (a resume, a retry)."""
from __future__ import annotations

from runtime_helpers import submit, wait_finished

from lmsp.contracts import NewTask
from lmsp.runtime import prompt as prompting


def test_a_long_context_is_kept_as_far_as_the_truncated_prompt_holds(store, runtime, config):
    assert wait_finished(runtime, store, submit(store, runtime, max_output_tokens=2))["status"] == "completed"
    engine = runtime.registry.engine("tiny")  # loaded: the admission renders the prompt
    context = [{"role": ("user", "assistant")[i % 2], "content": f"turn {i} " + "word " * 150} for i in range(40)]
    request = {"model": "tiny", "input": "and?", "temperature": 0.0, "truncation": "auto", "max_output_tokens": 4,
               "instructions": "Be brief.", "context": context}
    messages = [{"role": "system", "content": "Be brief."}, *context, {"role": "user", "content": "and?"}]
    created = runtime.create_task(NewTask(client_id=None, model="tiny", messages=messages, request=request,
                                          on_restart="resume", background=True, stream=False))
    stored = store.get_request(created["response"]["id"])
    assert 0 < len(stored["context"]) < len(context)
    assert stored["context"] == context[-len(stored["context"]):]  # the oldest turns went
    max_tokens = prompting.sampling(request, config)["max_tokens"]
    assert prompting.prompt_tokens(engine, stored, max_tokens) == prompting.prompt_tokens(engine, request, max_tokens)
    whole = prompting.render(engine, prompting.messages_for(request))
    assert len(prompting.prompt_tokens(engine, stored, max_tokens)) < len(whole)  # truncation did cut it
    wait_finished(runtime, store, created["task"]["id"])


def test_a_context_the_prompt_holds_whole_is_kept_whole(store, runtime):
    assert wait_finished(runtime, store, submit(store, runtime, max_output_tokens=2))["status"] == "completed"
    context = [{"role": "user", "content": "My name is Alice."}, {"role": "assistant", "content": "Hello Alice."}]
    request = {"model": "tiny", "input": "and?", "truncation": "auto", "max_output_tokens": 4, "context": context}
    created = runtime.create_task(NewTask(client_id=None, model="tiny", messages=[*context, {"role": "user",
                                          "content": "and?"}], request=request, on_restart="fail",
                                          background=True, stream=False))
    assert store.get_request(created["response"]["id"])["context"] == context
    wait_finished(runtime, store, created["task"]["id"])
