"""A task resumed after its worker died while tokens were held back without text
(part of a UTF-8 character, a possible stop string, a possible call's opening):
their text and log probabilities were never committed, so the engine samples
them again and the resumed output equals the uninterrupted one's, log
probabilities included. Which token is held back depends on the model's output,
so the crash is written into the store here exactly as a worker leaves it."""

from __future__ import annotations

import json

from runtime_helpers import submit, wait_finished

from lmsp.items.chat import TEXT_DELTA
from lmsp.objects import LOGPROBS

REQUEST = {"max_output_tokens": 12, "top_logprobs": 2, "include": [LOGPROBS]}


def delta_rows(store, task_id) -> list[tuple[str, list[int], list[dict]]]:
    """A task's text deltas as the store holds them: text, token ids, log probabilities."""
    with store._db.read() as conn:
        rows = conn.execute("SELECT text, tokens, data FROM task_events WHERE task_id = ? AND type = ? ORDER BY seq",
                            (task_id, TEXT_DELTA)).fetchall()
    return [(text, [int(t) for t in tokens.split(",")], json.loads(data)["logprobs"]) for text, tokens, data in rows]


def crash_point(rows: list[tuple[str, list[int], list[dict]]]) -> tuple[dict, dict]:
    """Where a crash leaves an output: a delta of its first tokens (as many as make
    whole characters), and the next token held back. How many tokens a committed
    delta holds depends on the commit window, so the rows are split token by token:
    each token's log probability entry carries its bytes."""
    tokens = [t for _, ids, _ in rows for t in ids]
    entries = [e for _, _, logprobs in rows for e in logprobs]
    assert len(tokens) == len(entries) >= 2
    text = "".join(t for t, _, _ in rows)
    assert bytes(b for e in entries for b in e["bytes"]).decode() == text
    for k in range(1, len(tokens)):
        try:
            head = bytes(b for e in entries[:k] for b in e["bytes"]).decode()
        except UnicodeDecodeError:
            continue
        committed = {"delta": head, "tokens": tokens[:k], "logprobs": entries[:k]}
        return committed, {"delta": "", "tokens": tokens[k : k + 1], "logprobs": entries[k : k + 1]}
    raise AssertionError("no token boundary of the output ends a character")


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
    committed, held = crash_point(rows)

    # a worker committed the text of the first tokens, then held the next one back, and died
    crashed = submit(store, None, on_restart="resume", **REQUEST)
    assert [c["task_id"] for c in store.claim("dead", limit=1, lease=30)] == [crashed]
    store.set_running(crashed, "dead")
    store.append_step("dead", [{"task_id": crashed, **committed}])
    store.append_step("dead", [{"task_id": crashed, **held}])

    assert store.recover(startup=True)["resumed"] == [crashed]
    rt2 = make_runtime(store)
    rt2.register_model("tiny.gguf")
    assert wait_finished(rt2, store, crashed)["status"] == store.get_task(reference)["status"]
    assert content(store, crashed) == content(store, reference)
    resumed = delta_rows(store, crashed)
    assert [t for _, ids, _ in resumed for t in ids] == [t for _, ids, _ in rows for t in ids]
    assert "".join(r[0] for r in resumed) == "".join(r[0] for r in rows)
