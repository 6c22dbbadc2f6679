"""Log probabilities of schema-constrained tasks, on the real store and the demo
model: the entries of the delta rows are the engine's over the tokens the
grammar allows (a greedy token is its position's likeliest, the alternatives
sum to at most 1), and a replay or a resumed task writes the same rows."""
from __future__ import annotations

import json
import math

from runtime_helpers import all_events, queued, wait_finished, wait_until

from lmsp.objects import LOGPROBS
from lmsp.runtime import open_store

SCHEMA = {
    "type": "object",
    "properties": {"word": {"type": "string", "maxLength": 40}, "n": {"type": "integer"}},
    "required": ["word", "n"],
    "additionalProperties": False,
}
REQUEST = {
    "text": {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}},
    "include": [LOGPROBS],
    "top_logprobs": 5,
    "max_output_tokens": 60,
}


def submit(store, runtime, *, on_restart="fail", **request) -> str:
    """A task asking for a JSON answer (runtime_helpers.submit names its input ``text``)."""
    request = {"model": "tiny", "input": "Say something", "temperature": 0.0, **REQUEST, **request}
    created = store.create_task(client_id=None, model="tiny", request=request, on_restart=on_restart,
                                background=True, stream=False)
    queued(runtime)
    return created["task"]["id"]


def deltas(store, task_id) -> list[tuple[str, list[dict]]]:
    events = all_events(store, task_id)
    return [(e["delta"], e["logprobs"]) for e in events if e["type"] == "response.output_text.delta"]


def test_the_rows_carry_the_constrained_distribution(store, runtime):
    task_id = submit(store, runtime)
    wait_finished(runtime, store, task_id)
    rows = deltas(store, task_id)
    entries = [e for _, logprobs in rows for e in logprobs]
    assert entries and all(logprobs for _, logprobs in rows)
    for e in entries:
        alternatives = e["top_logprobs"]
        assert alternatives[0]["token"] == e["token"] and alternatives[0]["logprob"] == e["logprob"]  # greedy
        assert sum(math.exp(a["logprob"]) for a in alternatives) <= 1 + 1e-5
    again = submit(store, runtime)
    wait_finished(runtime, store, again)
    # the same text and entries (how they are grouped into rows is the commit window's)
    flat = [(text, [e for _, logprobs in rows for e in logprobs]) for text in ["".join(d for d, _ in rows)]]
    rows_again = deltas(store, again)
    assert [("".join(d for d, _ in rows_again), [e for _, logprobs in rows_again for e in logprobs])] == flat


def test_a_resumed_task_writes_the_same_rows(config, store, make_runtime, model_file):
    rt = make_runtime(store)
    rt.register_model("tiny.gguf")
    request = {"temperature": 1.2, "seed": 9}
    task_id = submit(store, rt, on_restart="resume", **request)
    wait_until(rt, store, task_id, lambda t: t["last_sequence_number"] >= 10)
    rt.abort()
    before = all_events(store, task_id)
    restarted = open_store(config)
    try:
        assert restarted.recover(startup=True)["resumed"] == [task_id]
        rt2 = make_runtime(restarted)
        rt2.register_model("tiny.gguf")
        assert wait_finished(rt2, restarted, task_id)["status"] in ("completed", "incomplete")
        assert all_events(restarted, task_id)[: len(before)] == before
        reference = submit(restarted, rt2, **request)
        wait_finished(rt2, restarted, reference)
        resumed, ref = (restarted.get_response(restarted.get_task(t)["response_id"]) for t in (task_id, reference))
        [part] = resumed["output"][0]["content"]
        assert part == ref["output"][0]["content"][0] and part["logprobs"]
        if resumed["status"] == "completed":
            assert set(json.loads(part["text"])) == {"word", "n"}
        rt2.stop()
    finally:
        restarted.close()
