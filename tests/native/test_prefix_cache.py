"""The prefix cache: a free slot keeps its last sequence's KV, and a new
sequence that starts with the same tokens prefills only the rest.

On the CPU the engine is batch invariant, so a cached prefix holds exactly
what a prefill of the same tokens computes: every output here is compared,
token for token, with an engine that prefills everything."""
from __future__ import annotations

import numpy as np
import pytest
from native_helpers import N_GPU_LAYERS, drain, generate, prompt_tokens, take

pytestmark = pytest.mark.skipif(N_GPU_LAYERS != 0, reason="exactness needs the batch-invariant CPU backend")

CASES = {
    "greedy": dict(temperature=0),
    "sampled": dict(temperature=0.9, top_k=50, seed=5),
}


@pytest.fixture
def pair(make_engine):
    """An engine with the prefix cache and one without."""
    return make_engine(n_parallel=2, n_ctx=1024), make_engine(n_parallel=2, n_ctx=1024, prefix_cache=False)


@pytest.mark.parametrize("case", list(CASES))
def test_the_next_turn_of_a_conversation_prefills_only_what_is_new(pair, case: str) -> None:
    cached, plain = pair
    params = CASES[case]
    first_prompt = prompt_tokens(cached, "User: tell me about rivers.\nAssistant:")
    first = generate(cached, first_prompt, max_tokens=24, **params)
    assert first.finish == "length" and first.last["n_cached"] == 0
    # the next turn repeats the conversation so far and adds to it
    follow_up = first_prompt + first.tokens + prompt_tokens(cached, "\nUser: and lakes?\nAssistant:")[1:]
    second = generate(cached, follow_up, max_tokens=24, **params)
    # the first turn's last token was sampled, never fed: its KV is not there
    assert second.last["n_cached"] == len(first_prompt) + len(first.tokens) - 1
    assert second.last["n_prompt"] == len(follow_up)
    want = generate(plain, follow_up, max_tokens=24, **params)
    assert want.last["n_cached"] == 0
    assert (second.tokens, second.text) == (want.tokens, want.text)


def test_a_repeated_prompt_takes_its_first_token_from_the_kept_logits(pair) -> None:
    cached, _ = pair
    prompt = prompt_tokens(cached, "Once upon a time")
    first = generate(cached, prompt, max_tokens=16, temperature=0.8, seed=3)
    again = generate(cached, prompt, max_tokens=16, temperature=0.8, seed=3)
    assert again.last["n_cached"] == len(prompt)  # test_repeated_prompt.py
    assert (again.tokens, again.text) == (first.tokens, first.text)


def test_a_new_sequence_takes_the_slot_that_holds_its_prefix(pair) -> None:
    cached, plain = pair
    a = prompt_tokens(cached, "Alpha alpha alpha alpha")
    b = prompt_tokens(cached, "Bravo bravo bravo bravo bravo")
    runs = drain(cached, [cached.submit(a, max_tokens=4, temperature=0),
                          cached.submit(b, max_tokens=4, temperature=0)])
    assert all(r.finish == "length" for r in runs.values())
    # each slot now holds one of them: each follow-up finds its own
    for prompt in (b, a):
        longer = prompt + [450, 4996, 17354]
        got = generate(cached, longer, max_tokens=8, temperature=0)
        assert got.last["n_cached"] == len(prompt)
        assert got.tokens == generate(plain, longer, max_tokens=8, temperature=0).tokens
    # an unrelated prompt (it shares the BOS token only) is no hit: it takes
    # the slot freed longest ago, b's, and a's stays
    generate(cached, prompt_tokens(cached, "Charlie"), max_tokens=4, temperature=0)
    assert generate(cached, a + [450], max_tokens=2, temperature=0).last["n_cached"] == len(a)
    assert generate(cached, b + [450], max_tokens=2, temperature=0).last["n_cached"] == 0


def test_sequences_batched_together_take_what_they_can_and_match(pair) -> None:
    cached, plain = pair
    base = prompt_tokens(cached, "A shared system message that every request begins with.")
    generate(cached, base, max_tokens=4, temperature=0)
    prompts = [base + [1000 + 7 * i, 2000 + i] for i in range(3)]
    # short answers: the base stays most of what a slot then holds, so it is reused
    params = dict(max_tokens=6, temperature=0.7, top_k=40, seed=11)
    got = drain(cached, [cached.submit(p, **params) for p in prompts])
    want = drain(plain, [plain.submit(p, **params) for p in prompts])
    # two slots: the first takes the one that holds the base; the others take
    # the empty one or, once a sequence has ended, the base's slot again, which
    # depends on when the engine admits them: each reuses the whole base or none
    cached_counts = [r.last["n_cached"] for r in got.values()]
    assert cached_counts[0] == len(base)
    assert set(cached_counts[1:]) <= {0, len(base)}
    assert [r.tokens for r in got.values()] == [r.tokens for r in want.values()]


def test_a_cancelled_sequence_leaves_what_it_computed(pair) -> None:
    cached, plain = pair
    prompt = prompt_tokens(cached, "Count with me:")
    seq = cached.submit(prompt, max_tokens=500, temperature=0)
    run = take(cached, 10)
    cached.cancel(seq)
    rest = drain(cached, [seq])[seq]
    assert rest.finish == "cancelled"
    generated = run.tokens + rest.tokens
    follow_up = prompt + generated + [13]
    got = generate(cached, follow_up, max_tokens=12, temperature=0)
    assert len(prompt) <= got.last["n_cached"] <= len(prompt) + len(generated)
    assert got.tokens == generate(plain, follow_up, max_tokens=12, temperature=0).tokens


def test_off_means_every_prompt_is_prefilled(pair) -> None:
    _, plain = pair
    prompt = prompt_tokens(plain, "Once upon a time")
    generate(plain, prompt, max_tokens=4, temperature=0)
    assert generate(plain, prompt + [450], max_tokens=4, temperature=0).last["n_cached"] == 0


def test_eval_logits_after_cached_runs_starts_from_nothing(pair) -> None:
    cached, plain = pair
    prompt = prompt_tokens(cached, "The quick brown fox")
    generate(cached, prompt, max_tokens=8, temperature=0)
    got = np.asarray(cached.eval_logits(prompt + [450]))
    want = np.asarray(plain.eval_logits(prompt + [450]))
    np.testing.assert_array_equal(got, want)
    # and the slot it used holds nothing afterwards
    assert generate(cached, prompt, max_tokens=2, temperature=0).last["n_cached"] in (0, len(prompt) - 1)


def test_a_resume_with_kv_state_ignores_the_cache(make_engine) -> None:
    first = make_engine(n_parallel=1, n_ctx=1024)
    prompt = prompt_tokens(first, "Once upon a time")
    full = generate(first, prompt, max_tokens=30, temperature=0)
    seq = first.submit(prompt, max_tokens=30, temperature=0)
    take(first, 8)
    snap = first.snapshot(seq, with_kv=True)
    first.cancel(seq)
    drain(first, [seq])
    second = make_engine(n_parallel=1, n_ctx=1024)
    # the only slot holds another prompt's KV
    generate(second, prompt_tokens(second, "Something else entirely"), max_tokens=6, temperature=0)
    resumed = generate(second, prompt, max_tokens=30, temperature=0, resume=snap)
    assert resumed.last["n_cached"] == 0
    assert snap["generated"] + resumed.tokens == full.tokens


def test_a_sequence_reuses_only_kv_left_under_its_own_cache_key(pair) -> None:
    cached, plain = pair
    prompt = prompt_tokens(cached, "A secret that only one client should find quickly")
    generate(cached, prompt, max_tokens=4, temperature=0, cache_key="client-a")
    other = generate(cached, prompt + [450], max_tokens=6, temperature=0, cache_key="client-b")
    assert other.last["n_cached"] == 0
    # b's run took the other slot: a's KV is still there for a
    same = generate(cached, prompt + [450], max_tokens=6, temperature=0, cache_key="client-a")
    assert same.last["n_cached"] == len(prompt)
    assert same.tokens == other.tokens == generate(plain, prompt + [450], max_tokens=6, temperature=0).tokens


def test_a_prompt_sharing_only_the_opening_does_not_evict_a_conversation(make_engine) -> None:
    engine = make_engine(n_parallel=2, n_ctx=1024)
    opening = prompt_tokens(engine, "System: you are terse.\nUser:")
    conversation = opening + prompt_tokens(engine, " tell me about the sea, the waves and the tides")[1:]
    generate(engine, conversation, max_tokens=20, temperature=0)
    # another question of the same client, with the same opening: the empty slot
    other = generate(engine, opening + [6159, 1048], max_tokens=4, temperature=0)
    assert other.last["n_cached"] == 0
    turn = generate(engine, conversation + [450], max_tokens=4, temperature=0)
    assert turn.last["n_cached"] == len(conversation)
    # a long shared opening is worth a slot on its own
    long_opening = [1] + [3000 + (7 * i) % 500 for i in range(300)]
    generate(engine, long_opening + [100 + i for i in range(400)], max_tokens=2, temperature=0)
    # (its question is long enough for a tiled chunk of its own: a shorter one
    # would also take the opening's last rows again, see test_quantize.py)
    reuse = generate(engine, long_opening + [999 - i for i in range(64)], max_tokens=2, temperature=0)
    assert reuse.last["n_cached"] == len(long_opening)
