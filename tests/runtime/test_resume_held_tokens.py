"""A task resumed after its worker died while tokens were held back without text
(part of a UTF-8 character, a possible stop string, a possible call's opening):
their text and log probabilities were never committed, so the engine samples
them again and the resumed output equals the uninterrupted one's, log
probabilities included. Which token is held back depends on the model's output,
so the crash is written into the store here exactly as a worker leaves it."""

from __future__ import annotations

import json

from runtime_helpers import submit, wait_finished

from lmsp.chat_items import TEXT_DELTA
from lmsp.objects import LOGPROBS

REQUEST = {"max_output_tokens": 12, "top_logprobs": 2, "include": [LOGPROBS]}


def delta_rows(store, task_id) -> list[tuple[str, list[int], list[dict]]]:
    """A task's text deltas as the store holds them: text, token ids, log probabilities."""
    with store._db.read() as conn:
        rows = conn.execute("SELECT text, tokens, data FROM task_events WHERE task_id = ? AND type = ? ORDER BY seq",
                            (task_id, TEXT_DELTA)).fetchall()
    return [(text, [int(t) for t in tokens.split(",")], json.loads(data)["logprobs"]) for text, tokens, data in rows]


def content(store, task_id) -> dict:
    [part] = store.get_response(store.get_task(task_id)["response_id"])["output"][0]["content"]
    return part


def test_a_token_held_back_at_the_crash_is_sampled_again_with_its_log_probabilities(store, make_runtime,
                                                                                   model_file):
    rt = make_runtime(store)
    rt.register_model("tiny.gguf")
    reference = submit(store, rt, **REQUEST)
    assert wait_finished(rt, store, reference)["status"] in ("completed", "incomplete")
    rt.stop()
    rows = delta_rows(store, reference)
    assert len(rows) >= 3 and content(store, reference)["logprobs"]

    # a worker committed two deltas, then held the third one's tokens back, and died
    crashed = submit(store, None, on_restart="resume", **REQUEST)
    assert [c["task_id"] for c in store.claim("dead", limit=1, lease=30)] == [crashed]
    store.set_running(crashed, "dead")
    for text, tokens, logprobs in rows[:2]:
        store.append_step("dead", [{"task_id": crashed, "delta": text, "tokens": tokens, "logprobs": logprobs}])
    _, held, held_logprobs = rows[2]
    store.append_step("dead", [{"task_id": crashed, "delta": "", "tokens": held, "logprobs": held_logprobs}])

    assert store.recover(startup=True)["resumed"] == [crashed]
    rt2 = make_runtime(store)
    rt2.register_model("tiny.gguf")
    assert wait_finished(rt2, store, crashed)["status"] == store.get_task(reference)["status"]
    assert content(store, crashed) == content(store, reference)
    assert [r[:2] for r in delta_rows(store, crashed)] == [r[:2] for r in rows]
