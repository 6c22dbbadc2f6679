"""Snapshot and resume: a sequence continued in a new engine gives the output
it would have given uninterrupted, with its KV state and without it."""
from __future__ import annotations

import pytest
from native_helpers import Run, drain, generate

from lmsp.native import Engine

PROMPT = [1, 450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203, 29889]
CASES = {
    "greedy": dict(temperature=0),
    "sampled": dict(temperature=0.9, top_p=0.95, top_k=50, seed=17),
}
# long enough that the interrupted sequence is still running at its snapshot,
# however slowly the test is scheduled
LONG = 4096


def interrupted(engine: Engine, params: dict, after: int, with_kv: bool) -> dict:
    """Runs a long sequence until at least ``after`` tokens came out, takes a
    snapshot, then cancels it."""
    seq = engine.submit(PROMPT, max_tokens=LONG, **params)
    run = Run()
    while len(run.tokens) < after:
        engine.wait(60)
        for r in engine.poll():
            run.tokens += r["tokens"]
            run.text += r["text"]
    snap = engine.snapshot(seq, with_kv=with_kv)
    # the snapshot covers everything already handed out, and the results
    # still queued continue it exactly
    assert snap["generated"][:len(run.tokens)] == run.tokens
    assert snap["emitted"].startswith(run.text)
    assert snap["n_prompt"] == len(PROMPT)
    assert engine.cancel(seq)
    rest = drain(engine, [seq])[seq]
    assert rest.finish == "cancelled"
    assert (run.tokens + rest.tokens)[:len(snap["generated"])] == snap["generated"]
    assert (run.text + rest.text).startswith(snap["emitted"])
    return snap


def _strided(data: bytes) -> memoryview:
    """The same bytes as a memoryview that is not contiguous."""
    spread = bytearray(2 * len(data))
    spread[::2] = data
    return memoryview(spread)[::2]


@pytest.mark.parametrize("wrap", [bytearray, _strided], ids=["bytearray", "memoryview"])
def test_kv_state_as_any_bytes_like(make_engine, wrap) -> None:
    first = make_engine(n_parallel=1, n_ctx=LONG)
    snap = interrupted(first, CASES["greedy"], after=12, with_kv=True)
    max_tokens = len(snap["generated"]) + 10
    full = generate(first, PROMPT, max_tokens=max_tokens, **CASES["greedy"])
    first.close()
    second = make_engine(n_parallel=1, n_ctx=LONG)
    kv = wrap(snap["kv_state"])
    assert bytes(kv) == snap["kv_state"]
    seq = second.submit(PROMPT, max_tokens=max_tokens, resume=dict(snap, kv_state=kv), **CASES["greedy"])
    assert snap["generated"] + drain(second, [seq])[seq].tokens == full.tokens


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_kv", [True, False], ids=["kv", "prefill"])
def test_resume_in_a_new_engine_continues_the_same_output(make_engine, case: str, with_kv: bool) -> None:
    params = CASES[case]
    first = make_engine(n_parallel=2, n_ctx=LONG)
    snap = interrupted(first, params, after=12, with_kv=with_kv)
    assert (snap["kv_state"] is not None) == with_kv
    max_tokens = len(snap["generated"]) + 30
    full = generate(first, PROMPT, max_tokens=max_tokens, **params)
    assert full.finish == "length"
    first.close()

    second = make_engine(n_parallel=2, n_ctx=LONG)
    # a neighbour in the new engine changes nothing
    other = second.submit([1, 2000, 3000, 4000], max_tokens=30, temperature=0)
    seq = second.submit(PROMPT, max_tokens=max_tokens, resume=snap, **params)
    runs = drain(second, [other, seq])
    resumed = runs[seq]
    assert snap["generated"] + resumed.tokens == full.tokens
    assert snap["emitted"] + resumed.text == full.text
    assert resumed.finish == "length"
    assert resumed.last["n_generated"] == max_tokens and resumed.last["n_prompt"] == len(PROMPT)


def test_resume_from_persisted_results_with_a_stop_string(engine: Engine) -> None:
    # what a service keeps of a running sequence: the tokens and text of the
    # results it committed
    full = generate(engine, PROMPT, max_tokens=60, temperature=0)
    stop = full.text[40:43]
    params = dict(max_tokens=60, temperature=0, stop=[stop])
    want = generate(engine, PROMPT, **params)
    assert want.finish == "stop" and len(want.results) > 4
    for k in range(1, len(want.results)):
        done = want.results[:k]
        resume = {"generated": [t for r in done for t in r["tokens"]], "emitted": "".join(r["text"] for r in done)}
        resumed = generate(engine, PROMPT, resume=resume, **params)
        assert resume["generated"] + resumed.tokens == want.tokens
        assert resume["emitted"] + resumed.text == want.text
        assert resumed.finish == "stop"


def test_a_kv_state_that_does_not_fit_falls_back_to_prefill(make_engine) -> None:
    params = CASES["greedy"]
    e = make_engine(n_parallel=1, n_ctx=LONG)
    snap = interrupted(e, params, after=5, with_kv=True)
    max_tokens = len(snap["generated"]) + 10
    full = generate(e, PROMPT, max_tokens=max_tokens, **params)
    bad = dict(snap, kv_state=b"\x00garbage" * 10)
    resumed = generate(e, PROMPT, max_tokens=max_tokens, resume=bad, **params)
    assert snap["generated"] + resumed.tokens == full.tokens


def test_resume_of_a_finished_sequence_ends_at_once(engine: Engine) -> None:
    params = dict(max_tokens=6, temperature=0)
    full = generate(engine, PROMPT, **params)
    again = generate(engine, PROMPT, resume={"generated": full.tokens, "emitted": full.text}, **params)
    assert again.tokens == [] and again.text == "" and again.finish == "length"


def test_snapshot_of_a_waiting_and_an_unknown_sequence(make_engine) -> None:
    e = make_engine(n_parallel=1, n_ctx=LONG)
    running = e.submit(PROMPT, max_tokens=LONG, temperature=0)
    waiting = e.submit(PROMPT, max_tokens=LONG, temperature=0)
    snap = e.snapshot(waiting, with_kv=True)
    assert snap == {"generated": [], "emitted": "", "n_prompt": len(PROMPT), "kv_state": None}
    with pytest.raises(KeyError):
        e.snapshot(987654)
    e.cancel(running)
    e.cancel(waiting)
    drain(e, [running, waiting])
    with pytest.raises(KeyError):
        e.snapshot(running)  # finished
