"""The engine on the demo model: determinism, batching, stops, cancel, errors, threads."""
from __future__ import annotations

import select
import subprocess
import sys
import threading

import gevent
import gevent.socket
import numpy as np
import pytest
from native_helpers import (N_GPU_LAYERS, Watch, around_a_free_slot, drain, generate, prompt_tokens,
                            random_prompt)

from lmsp.native import ContextLengthError, Engine, EngineClosedError, NativeError, set_logging

SAMPLED = dict(temperature=0.9, top_p=0.9, top_k=40)
# a context (and max_tokens) long enough that a sequence is still running when
# the test acts on it, however slowly the test itself is scheduled
LONG = 4096


def test_info_and_sizes(engine: Engine) -> None:
    info = engine.info
    assert info["architecture"] == "llama"
    assert info["backend"] == ("cuda" if N_GPU_LAYERS else "cpu")
    assert info["n_ctx"] == engine.n_ctx == 512
    assert info["n_parallel"] == engine.n_parallel == 4
    assert engine.n_vocab == info["vocab_size"] == 32000


def test_tokenize_and_detokenize(engine: Engine) -> None:
    text = "Hello world, ünïcödé and 日本語"
    tokens = engine.tokenize(text)
    assert tokens[0] == 1  # BOS
    assert engine.tokenize(text, add_special=False) == tokens[1:]
    assert engine.detokenize(tokens).strip() == text
    # byte tokens 3..258 stand for bytes 0..255: E6 97 A5 is one character
    assert engine.detokenize([3 + 0xE6, 3 + 0x97, 3 + 0xA5]) == "日"
    assert engine.detokenize([3 + 0xE6, 3 + 0x97]) == "\ufffd"
    assert engine.detokenize([]) == ""


def test_the_models_chat_template(engine: Engine) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 日本"}]
    assert engine.apply_chat_template(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 日本<|im_end|>\n<|im_start|>assistant\n")
    assert engine.apply_chat_template(messages, add_generation_prompt=False).endswith("Hi 日本<|im_end|>\n")


def test_a_model_without_template_gets_the_fallback(demo_model_path, tmp_path) -> None:
    data = demo_model_path.read_bytes()
    assert data.count(b"tokenizer.chat_template") == 1
    path = tmp_path / "no-template.gguf"
    path.write_bytes(data.replace(b"tokenizer.chat_template", b"tokenizer.chat_templatX"))
    with Engine(str(path), n_ctx=64, n_parallel=1, n_threads=1) as e:
        assert e.info["chat_template"] is None
        messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                    {"role": "assistant", "content": "A"}]
        assert e.apply_chat_template(messages) == "System: S\n\nUser: U\n\nAssistant: A\n\nAssistant:"


@pytest.mark.parametrize("messages", [
    [{"role": "robot", "content": "x"}],
    [{"role": "user"}],
    [{"role": "user", "content": "a\0b"}],
])
def test_bad_messages(engine: Engine, messages: list) -> None:
    with pytest.raises(ValueError):
        engine.apply_chat_template(messages)


def test_greedy_is_deterministic(engine: Engine) -> None:
    prompt = prompt_tokens(engine, "The quick brown fox")
    a = generate(engine, prompt, max_tokens=24, temperature=0)
    b = generate(engine, prompt, max_tokens=24, temperature=0, seed=99)  # the seed plays no part
    assert a.tokens == b.tokens and a.text == b.text
    assert a.finish == "length" and len(a.tokens) == 24
    assert a.last["n_generated"] == 24 and a.last["n_prompt"] == len(prompt)
    assert [r["n_generated"] for r in a.results] == list(range(1, 25))
    assert all(r["finish"] is None and r["timings"] == {} for r in a.results[:-1])
    timings = a.last["timings"]
    assert timings["first_token_ms"] >= timings["prompt_ms"] >= 0 and timings["decode_ms"] >= 0
    # greedy is the argmax of the logits at every step
    logits = engine.eval_logits(prompt + a.tokens[:-1])
    assert logits[len(prompt) - 1:].argmax(axis=1).tolist() == a.tokens


def test_sampling_depends_on_the_seed_only(engine: Engine) -> None:
    prompt = prompt_tokens(engine, "Once upon a time")
    a = generate(engine, prompt, max_tokens=24, seed=7, **SAMPLED)
    b = generate(engine, prompt, max_tokens=24, seed=7, **SAMPLED)
    c = generate(engine, prompt, max_tokens=24, seed=8, **SAMPLED)
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens
    huge = generate(engine, prompt, max_tokens=4, seed=2**64 + 7, **SAMPLED)  # taken modulo 2**64
    assert huge.tokens == a.tokens[:4]


def test_top_k_one_is_greedy(engine: Engine) -> None:
    prompt = prompt_tokens(engine, "Top k")
    greedy = generate(engine, prompt, max_tokens=12, temperature=0)
    assert generate(engine, prompt, max_tokens=12, temperature=1.5, top_k=1, seed=3).tokens == greedy.tokens


@pytest.mark.parametrize("top_k", [3, 0])
def test_a_top_p_reached_at_the_last_candidate_still_samples(engine: Engine, top_k: int) -> None:
    """A hot, flat distribution and a top_p close to 1: the mass is reached only at the last
    candidate (of the top k, or of the whole vocabulary). The engine once looped there forever."""
    prompt = prompt_tokens(engine, "Top p at the end")
    seq = engine.submit(prompt, max_tokens=6, temperature=50.0, top_k=top_k, top_p=0.99999, seed=5)
    tokens, finish = [], None
    while finish is None:
        assert engine.wait(60), "no result from the engine within 60 s: it is stuck"
        for res in engine.poll():
            assert res["seq"] == seq
            tokens += res["tokens"]
            finish = res["finish"]
    assert finish == "length" and len(tokens) == 6


def test_a_tiny_top_p_keeps_only_the_best_token(engine: Engine) -> None:
    prompt = prompt_tokens(engine, "Top p")
    greedy = generate(engine, prompt, max_tokens=12, temperature=0)
    # the smallest prefix of the sorted candidates holding 1e-6 of the mass is the best token
    assert generate(engine, prompt, max_tokens=12, temperature=1.5, top_p=1e-6, seed=4).tokens == greedy.tokens
    wide = generate(engine, prompt, max_tokens=12, temperature=1.5, top_p=0.95, seed=4)
    assert wide.tokens == generate(engine, prompt, max_tokens=12, temperature=1.5, top_p=0.95, seed=4).tokens
    assert wide.tokens != greedy.tokens


@pytest.mark.parametrize("params", [dict(temperature=0), dict(seed=21, **SAMPLED)], ids=["greedy", "sampled"])
def test_alone_and_batched_give_the_same_tokens(engine: Engine, params: dict) -> None:
    prompt = random_prompt(0, 30)
    alone = generate(engine, prompt, max_tokens=40, **params)
    # three neighbours: a short prompt, one longer than prefill_chunk (prefilled
    # over several steps while the others decode) and one in between
    neighbours = [random_prompt(1, 5), random_prompt(2, 300), random_prompt(3, 70)]
    seqs = [engine.submit(p, max_tokens=40, **params) for p in neighbours[:2]]
    seqs.insert(1, engine.submit(prompt, max_tokens=40, **params))
    seqs.append(engine.submit(neighbours[2], max_tokens=40, **params))
    runs = drain(engine, seqs)
    assert runs[seqs[1]].tokens == alone.tokens
    assert runs[seqs[1]].text == alone.text


def test_more_sequences_than_slots_wait_their_turn(make_engine) -> None:
    e = make_engine(n_parallel=2)
    prompts = [random_prompt(i, 8 + i) for i in range(5)]
    alone = [generate(e, p, max_tokens=10, temperature=0).tokens for p in prompts]
    seqs = [e.submit(p, max_tokens=10, temperature=0) for p in prompts]
    assert len(set(seqs)) == 5
    runs = drain(e, seqs)
    assert [runs[s].tokens for s in seqs] == alone
    stats = e.stats()
    assert stats["active"] == stats["waiting"] == 0
    assert stats["submitted"] == stats["finished"] == 10
    assert stats["tokens_generated"] == 100 and stats["steps"] > 0


def test_a_new_sequence_fills_the_hole_between_two_running_ones(make_engine) -> None:
    """llama.cpp decodes a run of consecutive slots in one ubatch (one pass over
    the weights) and each further run in another: a sequence admitted while
    slots 0 and 2 run takes slot 1 (not the empty slot 3, though slot 1 still
    holds its last sequence's KV), so the three then decode in one ubatch per
    step."""
    e = make_engine(n_parallel=5, n_ctx=LONG)
    w = Watch(e)
    running = [e.submit(random_prompt(40 + i, 4), max_tokens=LONG, temperature=0) for i in range(3)]
    w.until(lambda: all(w.tokens.get(s) for s in running))  # slots 0, 1 and 2
    assert e.cancel(running[1])  # frees slot 1 before the next admission
    # (a prompt that no slot's cache holds the start of)
    joined = e.submit(random_prompt(43, 8), max_tokens=LONG, temperature=0)
    w.until(lambda: w.tokens.get(joined))  # from here every step decodes slots 0, 1 and 2
    before = e.stats()
    # (counted on the engine's side: poll() may hand over several steps' tokens at once)
    w.until(lambda: e.stats()["steps"] - before["steps"] >= 25 or w.ended & {running[0], running[2], joined})
    after = e.stats()
    assert not w.ended & {running[0], running[2], joined}  # (their answers are longer)
    steps = after["steps"] - before["steps"]
    assert steps >= 25
    # (a step under way while stats() read the counters may count on one side only)
    assert after["ubatches"] - before["ubatches"] <= steps + 1
    for seq in (running[0], running[2], joined):
        e.cancel(seq)
    w.until(lambda: w.ended >= set(running) | {joined})


def test_a_free_slot_between_running_ones_takes_a_filler_row(make_engine) -> None:
    """The other side of the test above: slot 1 freed while slots 0 and 2 run.
    A filler row in slot 1's KV stream, removed after each step, keeps the two
    in one ubatch; their tokens stay those of a run alone, and slot 1 keeps
    exactly the KV its sequence left (the state a persisted sequence saves)."""
    prompts = [random_prompt(50 + i, 4) for i in range(3)]
    lengths = [512, 8, 512]  # the middle one ends first, long before the others
    # the window: from slot 1's end to 128 tokens of slot 0, seen by this thread
    # (some 380 steps before slots 0 and 2 end)
    run = around_a_free_slot(make_engine(n_parallel=3, n_ctx=LONG), make_engine(n_parallel=3, n_ctx=LONG),
                             prompts, lengths, window_tokens=128)
    assert run.together == run.alone
    assert run.same_kv
    # slot 1 is free for some 500 steps (each sequence started within a few
    # steps of the others), counted by the engine whenever this thread sees the ends
    assert run.filler_rows >= 450
    # while it is free and both neighbours run (no sequence ended in the window,
    # by the engine's count), a filler row a step and one pass a step, however
    # few of those steps the window saw (a step under way while stats() read
    # the counters may count on one side only)
    assert run.window["finished"] == 0
    steps = run.window["steps"]
    assert steps - 1 <= run.window["filler_rows"] <= steps + 1
    assert run.window["ubatches"] <= steps + 1


def test_slots_far_apart_decode_in_a_ubatch_each(make_engine) -> None:
    """Filler rows cost a row each: more free slots between two running ones
    than a pass is worth (kMaxFillerRowsPerPass, 2) get none, and the two take a
    ubatch each, every step."""
    e = make_engine(n_parallel=7, n_ctx=LONG)
    w = Watch(e)
    seqs = [e.submit(random_prompt(50 + i, 4), max_tokens=LONG, temperature=0) for i in range(7)]
    w.until(lambda: all(w.tokens.get(s) for s in seqs))
    for seq in seqs[1:6]:
        assert e.cancel(seq)
    w.until(lambda: set(seqs[1:6]) <= w.ended)
    before = e.stats()
    w.until(lambda: e.stats()["steps"] - before["steps"] >= 20 or len(w.ended) > 5)
    after = e.stats()
    assert w.ended == set(seqs[1:6])
    steps = after["steps"] - before["steps"]
    assert steps >= 20
    assert abs((after["ubatches"] - before["ubatches"]) - 2 * steps) <= 2
    assert after["filler_rows"] == before["filler_rows"]
    e.cancel(seqs[0])
    e.cancel(seqs[6])
    w.until(lambda: len(w.ended) == 7)


def test_a_free_slot_whose_kv_is_longer_than_the_steps_takes_no_filler(make_engine) -> None:
    """A filler row in a slot that kept 300 positions would make every stream
    of the step attend to 512 cells instead of 256: slots 0 and 2, at fewer
    than 256 positions, then take a ubatch each instead."""
    e = make_engine(n_parallel=3, n_ctx=LONG)
    w = Watch(e)
    seqs = [e.submit(random_prompt(60, 4), max_tokens=150, temperature=0),
            e.submit(random_prompt(61, 300), max_tokens=1, temperature=0),
            e.submit(random_prompt(62, 4), max_tokens=150, temperature=0)]
    w.until(lambda: seqs[1] in w.ended and all(w.tokens.get(s) for s in seqs))
    before = e.stats()
    w.until(lambda: e.stats()["steps"] - before["steps"] >= 20 or len(w.ended) > 1)
    after = e.stats()
    assert w.ended == {seqs[1]}
    steps = after["steps"] - before["steps"]
    assert steps >= 20
    assert after["filler_rows"] == before["filler_rows"]
    assert abs((after["ubatches"] - before["ubatches"]) - 2 * steps) <= 2
    w.until(lambda: len(w.ended) == 3)


def test_stop_strings(engine: Engine) -> None:
    prompt = random_prompt(5, 12)
    full = generate(engine, prompt, max_tokens=40, temperature=0)
    assert len(full.text) > 20
    stop = full.text[10:14]
    cut = full.text.find(stop)
    stopped = generate(engine, prompt, max_tokens=40, temperature=0, stop=["never-seen", stop])
    assert stopped.finish == "stop"
    assert stopped.text == full.text[:cut]
    # the token that completed the stop string is the last one reported
    assert stopped.tokens == full.tokens[:len(stopped.tokens)]
    assert stop in engine.detokenize(stopped.tokens) and stop not in engine.detokenize(stopped.tokens[:-1])
    # a stop string that never comes changes nothing
    again = generate(engine, prompt, max_tokens=40, temperature=0, stop="never-seen")
    assert (again.tokens, again.text, again.finish) == (full.tokens, full.text, "length")


def test_output_text_is_whole_utf8(engine: Engine) -> None:
    prompt = prompt_tokens(engine, "日本語のテキスト, ünïcödé ✓")
    run = generate(engine, prompt, max_tokens=200, temperature=1.5, seed=3)
    assert run.finish == "length"
    assert any(ord(c) > 0x7F for c in run.text)  # multibyte characters came out
    # streamed pieces join to exactly the text the tokens add after the prompt
    # (detokenize() alone would drop the first token's leading space)
    before, after = engine.detokenize(prompt), engine.detokenize(prompt + run.tokens)
    assert after == before + run.text
    for r in run.results:
        r["text"].encode("utf-8")  # every piece is valid on its own


def test_a_full_context_ends_with_length(make_engine) -> None:
    e = make_engine(n_ctx=64, n_parallel=1)
    assert e.n_ctx == 64
    prompt = random_prompt(6, 60)
    run = generate(e, prompt, max_tokens=100, temperature=0)
    assert run.finish == "length"
    # 60 prompt positions + 4 decoded tokens fill 64; the 5th token is sampled last
    assert len(run.tokens) == 5


def test_prompts_that_do_not_fit(engine: Engine) -> None:
    with pytest.raises(ContextLengthError, match="513 tokens"):
        engine.submit([1] * 513, max_tokens=1)
    with pytest.raises(ContextLengthError):
        engine.submit([1] * 500, max_tokens=1, resume={"generated": [100] * 13, "emitted": "", "kv_state": None})
    with pytest.raises(ValueError):  # ContextLengthError is a ValueError and a NativeError
        engine.submit([1] * 600, max_tokens=1)
    assert issubclass(ContextLengthError, NativeError)
    run = generate(engine, [1] * 512, max_tokens=5, temperature=0)  # fits: one token comes out
    assert run.finish == "length" and len(run.tokens) == 1


@pytest.mark.parametrize(("kwargs", "error"), [
    (dict(prompt=[]), ValueError),
    (dict(prompt=[-1]), ValueError),
    (dict(prompt=[32000]), ValueError),
    (dict(prompt=[2**40]), ValueError),
    (dict(prompt="text"), TypeError),
    (dict(prompt=[1.5]), TypeError),
    (dict(max_tokens=0), ValueError),
    (dict(temperature=-0.1), ValueError),
    (dict(temperature=float("nan")), ValueError),
    (dict(top_p=0.0), ValueError),
    (dict(top_p=1.5), ValueError),
    (dict(top_k=-1), ValueError),
    (dict(seed=1.5), TypeError),
    (dict(stop=[""]), ValueError),
    (dict(stop=[3]), TypeError),
    (dict(resume={"generated": [1, 2], "emitted": "not this text"}), ValueError),
    (dict(resume={"generated": [99999]}), ValueError),
    (dict(resume={"kv_state": "str"}), TypeError),
    (dict(resume=[1]), TypeError),
])
def test_bad_submissions(engine: Engine, kwargs: dict, error: type) -> None:
    args = dict(prompt=[1, 100, 200], max_tokens=4) | kwargs
    prompt = args.pop("prompt")
    with pytest.raises(error):
        engine.submit(prompt, **args)
    assert engine.stats()["waiting"] == 0


@pytest.mark.parametrize(("kwargs", "error"), [
    (dict(n_ctx=0), ValueError),
    (dict(n_parallel=0), ValueError),
    (dict(n_parallel=100000), ValueError),
    (dict(n_threads=-1), ValueError),
    (dict(n_batch=2, n_parallel=4), ValueError),
    (dict(prefill_chunk=0), ValueError),
    (dict(n_threads=2**31 - 1), ValueError),  # more than ggml's 512 threads
])
def test_bad_engine_options(demo_model_path, kwargs: dict, error: type) -> None:
    with pytest.raises(error):
        Engine(str(demo_model_path), **kwargs)


def test_cancel_stops_within_one_step(make_engine) -> None:
    e = make_engine(n_parallel=1, n_ctx=LONG)
    steps_before = e.stats()["steps"]
    seq = e.submit(random_prompt(7, 10), max_tokens=LONG, temperature=0)
    assert e.wait(60)
    assert e.cancel(seq)
    steps_at_cancel = e.stats()["steps"]
    run = drain(e, [seq])[seq]
    assert run.finish == "cancelled"
    # its n-th token comes from its n-th step; at most the step under way when
    # cancel() returned may still add one
    assert len(run.tokens) == run.last["n_generated"] <= steps_at_cancel - steps_before + 1
    assert not e.cancel(seq)  # finished
    assert not e.cancel(123456)  # unknown


def test_cancel_a_waiting_sequence(make_engine) -> None:
    e = make_engine(n_parallel=1, n_ctx=LONG)
    first = e.submit(random_prompt(8, 10), max_tokens=LONG, temperature=0)
    second = e.submit(random_prompt(9, 10), max_tokens=LONG, temperature=0)
    assert e.cancel(second)
    assert e.cancel(first)
    runs = drain(e, [first, second])
    assert runs[second].finish == "cancelled"
    assert runs[second].results == [dict(runs[second].last, tokens=[], text="", n_generated=0)]
    assert runs[first].finish == "cancelled"


@pytest.mark.parametrize(("n_tokens", "wide_batch", "narrow_batch"), [(641, 512, 128), (700, 64, 1)])
def test_attention_is_batch_invariant_over_long_contexts_with_two_threads(
        make_engine, n_tokens: int, wide_batch: int, narrow_batch: int) -> None:
    """ggml's CPU flash attention has two kernels whose summation order depends on
    the batch: tiled for 64+ query rows of a sequence, and one query over 512+ KV
    cells split among the threads. eval_logits keeps every row on the per-row
    kernel (csrc/batch_plan.cpp), so a row's logits do not depend on how many rows
    were computed with it: 641 rows in batches of 512 and 129 against 128 five
    times and then one alone over 641 cells (K and V caches f16); 700 rows in
    batches of 64 against one at a time (batches under 128 rows: a bf16 V cache)."""
    tokens = random_prompt(11, n_tokens)
    wide = make_engine(n_ctx=1024, n_parallel=1, n_threads=2, n_batch=wide_batch)
    narrow = make_engine(n_ctx=1024, n_parallel=1, n_threads=2, n_batch=narrow_batch)
    np.testing.assert_array_equal(narrow.eval_logits(tokens), wide.eval_logits(tokens))


def test_eval_logits(engine: Engine) -> None:
    tokens = random_prompt(10, 20)
    logits = engine.eval_logits(tokens)
    assert logits.dtype == np.float32 and logits.shape == (20, engine.n_vocab)
    # causal, and bitwise independent of the batch's size: a prefix gives the
    # same rows, also a single token (the one-row matmul path)
    np.testing.assert_array_equal(engine.eval_logits(tokens[:7]), logits[:7])
    np.testing.assert_array_equal(engine.eval_logits(tokens[:1]), logits[:1])
    with pytest.raises(ValueError):
        engine.eval_logits([])
    with pytest.raises(ContextLengthError):
        engine.eval_logits([1] * 513)


def test_logprobs_are_the_models_log_probabilities(engine: Engine) -> None:
    prompt = random_prompt(12, 20)
    run = generate(engine, prompt, max_tokens=6, temperature=0.8, seed=4, logprobs=True)
    assert len(run.logprobs) == len(run.tokens) == 6
    assert all(lp <= 0.0 for lp in run.logprobs)
    # the first token's: ln softmax of the prompt's last row of logits
    last = engine.eval_logits(prompt)[-1].astype(np.float64)
    want = last[run.tokens[0]] - last.max() - np.log(np.exp(last - last.max()).sum())
    assert run.logprobs[0] == pytest.approx(want, abs=1e-5)
    # not asked for: not there
    assert "logprobs" not in generate(engine, prompt, max_tokens=2, temperature=0).last


def test_eval_logits_needs_an_idle_engine(make_engine) -> None:
    e = make_engine(n_parallel=1, n_ctx=LONG)
    seq = e.submit(random_prompt(11, 10), max_tokens=LONG, temperature=0)
    with pytest.raises(NativeError, match="idle"):
        e.eval_logits([1, 2, 3])
    e.cancel(seq)
    drain(e, [seq])


def test_a_python_thread_runs_while_the_engine_decodes(make_engine) -> None:
    e = make_engine(n_parallel=1)
    count = [0]
    done = threading.Event()

    def spin() -> None:
        while not done.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        seq = e.submit(random_prompt(12, 10), max_tokens=200, temperature=0)
        progress_during_waits = []
        finished = False
        while not finished:
            before = count[0]
            e.wait(60)  # blocks without the GIL
            progress_during_waits.append(count[0] - before)
            finished = any(r["finish"] for r in e.poll())
    finally:
        done.set()
        t.join()
    assert sum(progress_during_waits) > 0
    assert seq


def test_fileno_is_readable_while_results_are_pending(make_engine) -> None:
    e = make_engine(n_parallel=1)
    fd = e.fileno()
    assert select.select([fd], [], [], 0)[0] == []
    seq = e.submit(random_prompt(13, 6), max_tokens=3, temperature=0)
    # a greenlet waits on the fd while another keeps running on the hub
    ticks = [0]

    def tick() -> None:
        while True:
            ticks[0] += 1
            gevent.sleep(0)

    ticker = gevent.spawn(tick)
    try:
        gevent.socket.wait_read(fd, timeout=60)
    finally:
        ticker.kill()
    assert ticks[0] > 0
    # readable while anything is queued, until poll() drains the last result
    runs = {}
    while seq not in runs:
        assert select.select([fd], [], [], 60)[0] == [fd]
        for r in e.poll():
            if r["finish"]:
                runs[r["seq"]] = r
    assert select.select([fd], [], [], 0)[0] == []
    assert not e.wait(0)


def test_urgent_wait_sleeps_through_all_but_first_outputs_and_ends(make_engine) -> None:
    e = make_engine(n_parallel=3)
    fd, urgent_fd = e.fileno(), e.urgent_fileno()
    assert fd != urgent_fd
    assert select.select([urgent_fd], [], [], 0)[0] == []
    first = e.submit(random_prompt(14, 6), max_tokens=24, temperature=0)
    assert e.wait(60, urgent=True)
    assert select.select([urgent_fd], [], [], 0)[0] == [urgent_fd]
    # everything queued when poll() runs: at least up to the first text (a token may show
    # none yet), and whatever the engine made between the wake-up and the poll
    opened = e.poll()
    assert all(r["seq"] == first for r in opened)
    assert any(r["text"] for r in opened), "woken before the first text"
    assert select.select([urgent_fd], [], [], 0)[0] == []
    rest = []
    if opened[-1]["finish"] is None:
        # the next urgent result is the end: the tokens in between do not wake the waiter
        assert e.wait(60, urgent=True)
        rest = e.poll()
        assert rest[-1]["finish"] is not None
        assert not any(r["finish"] for r in rest[:-1])
    done = (opened + rest)[-1]
    assert done["finish"] in ("length", "stop")
    assert sum(len(r["tokens"]) for r in opened + rest) == done["n_generated"]
    assert not e.wait(0, urgent=True) and select.select([fd, urgent_fd], [], [], 0)[0] == []

    # several sequences: every urgent wake-up finds a first text or an end
    seqs = [e.submit(random_prompt(15 + i, 6), max_tokens=8 + 16 * i, temperature=0) for i in range(3)]
    seen: set[int] = set()
    ended: set[int] = set()
    while len(ended) < len(seqs):
        assert e.wait(60, urgent=True)
        results = e.poll()
        urgent = [r for r in results if r["finish"] or (r["text"] and r["seq"] not in seen)]
        assert urgent, results
        for r in results:
            if r["text"]:
                seen.add(r["seq"])
            if r["finish"]:
                ended.add(r["seq"])
    assert not e.wait(0, urgent=True)


def test_the_first_text_is_urgent_not_a_first_token_that_shows_none(make_engine) -> None:
    e = make_engine(n_parallel=1)
    prompt = random_prompt(18, 6)
    plain = generate(e, prompt, max_tokens=6, temperature=0)
    first_piece = plain.results[0]["text"]  # as streamed (the piece's leading space kept)
    assert plain.results[0]["tokens"] == plain.tokens[:1] and first_piece and plain.text.startswith(first_piece)
    # a stop string that begins with the first token's text holds that text back
    seq = e.submit(prompt, max_tokens=6, temperature=0, stop=[first_piece + "\x00never"])
    assert e.wait(60, urgent=True)
    results = e.poll()
    assert results[0]["tokens"] == plain.tokens[:1] and results[0]["text"] == ""
    # the urgent wake came with text, not at the first token; the engine may have taken
    # more steps before the poll, so the text need not be in the last result
    assert any(r["text"] for r in results), "woken as urgent by a token that shows no text"
    n = sum(len(r["tokens"]) for r in results)
    assert "".join(r["text"] for r in results) == "".join(r["text"] for r in plain.results[:n])
    if not any(r["finish"] for r in results):  # a slow poll may already hold the end
        e.cancel(seq)
        drain(e, [seq])


def test_close_twice_and_use_after_close(demo_model_path) -> None:
    e = Engine(str(demo_model_path), n_ctx=64, n_parallel=1, n_threads=1)
    seq = e.submit([1, 100, 200], max_tokens=1000, temperature=0)  # still running at close
    e.close()
    e.close()
    assert e.closed
    assert issubclass(EngineClosedError, RuntimeError) and issubclass(EngineClosedError, NativeError)
    calls = [
        lambda: e.submit([1], max_tokens=1), lambda: e.poll(), lambda: e.wait(0), lambda: e.fileno(),
        lambda: e.urgent_fileno(), lambda: e.wait(0, urgent=True),
        lambda: e.cancel(seq), lambda: e.snapshot(seq), lambda: e.tokenize("x"), lambda: e.detokenize([1]),
        lambda: e.apply_chat_template([]), lambda: e.eval_logits([1]), lambda: e.stats(),
    ]
    for call in calls:
        with pytest.raises(EngineClosedError):
            call()


def test_close_while_another_thread_tokenizes(demo_model_path) -> None:
    """A long tokenize runs without the GIL and without the engine's lock; a close()
    meanwhile must not free the vocabulary under it."""
    e = Engine(str(demo_model_path), n_ctx=64, n_parallel=1, n_threads=1)
    text = "hello world, this is some text " * 200_000
    out: dict = {}

    def tokenize() -> None:
        try:
            out["n"] = len(e.tokenize(text))
        except EngineClosedError:
            out["n"] = None
    worker = threading.Thread(target=tokenize)
    worker.start()
    e.close()
    worker.join(120)
    assert not worker.is_alive() and "n" in out
    if out["n"] is not None:  # it passed its check before the close: it finished on the model
        assert out["n"] > 1_000_000


def test_a_wait_without_end_waits(demo_model_path) -> None:
    """inf (or any timeout beyond the clock's range) is a wait without end, not none."""
    with Engine(str(demo_model_path), n_ctx=64, n_parallel=1, n_threads=1) as e:
        got: dict = {}
        waiter = threading.Thread(target=lambda: got.setdefault("woken", e.wait(float("inf"))))
        waiter.start()
        e.submit([1, 2], max_tokens=1)
        waiter.join(60)
        assert got == {"woken": True}
        assert e.wait(1e300) is True  # the result is still there


def test_a_batch_beyond_the_whole_context_is_bounded(demo_model_path) -> None:
    with Engine(str(demo_model_path), n_ctx=64, n_parallel=1, n_threads=1, n_batch=2**31 - 1) as e:
        assert generate(e, [1, 2, 3], max_tokens=4, temperature=0).finish == "length"


def test_context_manager_closes(demo_model_path) -> None:
    with Engine(str(demo_model_path), n_ctx=64, n_parallel=1, n_threads=1) as e:
        assert e.tokenize("a")
    assert e.closed


def test_llama_log_is_silent_unless_enabled(demo_model_path, capfd) -> None:
    with Engine(str(demo_model_path), n_ctx=64, n_parallel=1, n_threads=1):
        pass
    assert capfd.readouterr().err == ""
    set_logging(True)
    try:
        with Engine(str(demo_model_path), n_ctx=64, n_parallel=1, n_threads=1):
            pass
    finally:
        set_logging(False)
    assert "llama" in capfd.readouterr().err


OUT_OF_MEMORY = """
import resource, sys
from lmsp.native import Engine
Engine(sys.argv[1], n_ctx=64, n_parallel=1, n_threads=1).close()
size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
limit = size + 100 * 2**20  # room for 100 MiB more, the cache below needs 256
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    Engine(sys.argv[1], n_ctx=4096, n_parallel=256, n_threads=1)
except MemoryError as e:
    print("MemoryError:", e)
"""


def test_out_of_memory_is_a_memory_error(demo_model_path) -> None:
    # in a child process, whose address space is capped
    done = subprocess.run([sys.executable, "-c", OUT_OF_MEMORY, str(demo_model_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("MemoryError: out of memory creating a context"), done.stdout
