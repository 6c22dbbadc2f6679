"""A prompt asked again: a free slot that holds the prompt's KV and kept the
logits of its last row (its prefill's) gives the new sequence its first
token from them, with no row prefilled; what reads those logits (the
sampler, the grammar, log probabilities) sees what a prefill gives, so the
output is, token and log probability, an uncached engine's. Anything else
(another prompt, a longer or shorter one, another cache key, a slot whose
rows another sequence took) takes the prefix cache's usual path."""
from __future__ import annotations

import json

import pytest
from native_helpers import N_GPU_LAYERS, Run, drain, generate, random_prompt, take

from lmsp.native import Engine, schema_grammar

pytestmark = pytest.mark.skipif(N_GPU_LAYERS != 0, reason="exactness needs the batch-invariant CPU backend")

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
CASES = {
    "greedy": dict(temperature=0),
    "sampled": dict(temperature=0.9, top_k=50, seed=7, logprobs=True, top_logprobs=5),
    "schema": dict(temperature=0.8, seed=3, logprobs=True, top_logprobs=3,
                   grammar={"gbnf": schema_grammar(json.dumps(SCHEMA))}),
}
# prefilled the one-row way, and tiled (64 tokens or more)
LENGTHS = [12, 100]


def output(run: Run) -> tuple:
    """What a sequence gave, to the bit: tokens, text, log probabilities and alternatives."""
    tops = [alternatives for res in run.results for alternatives in res.get("top_logprobs", [])]
    return run.tokens, run.text, run.logprobs, tops, run.finish


def fed_after_the_prompt(run: Run) -> int:
    """The rows a sequence that prefilled nothing decodes: each token it generated but
    the last one of a sequence cut at its length."""
    return len(run.tokens) - (run.finish == "length")


@pytest.fixture
def pair(make_engine) -> tuple[Engine, Engine]:
    """An engine with the prefix cache and one without."""
    return make_engine(n_parallel=2, n_ctx=1024), make_engine(n_parallel=2, n_ctx=1024, prefix_cache=False)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("case", list(CASES))
def test_a_prompt_asked_again_prefills_nothing_and_answers_as_a_prefill(pair, case: str, n: int) -> None:
    cached, plain = pair
    params = dict(max_tokens=20, **CASES[case])
    prompt = random_prompt(40 + n, n)
    first = generate(cached, prompt, **params)
    assert first.last["n_cached"] == 0
    assert cached.cached_prefix(prompt) == n
    before = cached.stats()["tokens_decoded"]
    again = generate(cached, prompt, **params)
    assert again.last["n_cached"] == again.last["n_prompt"] == n
    assert cached.stats()["tokens_decoded"] - before == fed_after_the_prompt(again)
    want = generate(plain, prompt, **params)
    assert output(again) == output(want) == output(first)
    # and a third time, from the logits the second one left in place
    assert output(generate(cached, prompt, **params)) == output(want)


@pytest.mark.parametrize("n", LENGTHS)
def test_other_prompts_take_the_usual_path_and_stay_exact(pair, n: int) -> None:
    cached, plain = pair
    params = dict(max_tokens=12, **CASES["sampled"])
    prompt = random_prompt(50 + n, n)
    others = {
        "same length": random_prompt(60 + n, n),
        "one longer": prompt + [4321],
        "one shorter": prompt[:-1],
    }
    for name, other in others.items():
        generate(cached, prompt, **params)  # the prompt's KV and logits in a slot
        got = generate(cached, other, **params)
        assert got.last["n_cached"] < len(other), name
        assert output(got) == output(generate(plain, other, **params)), name


def test_another_cache_key_does_not_take_the_kept_logits(pair) -> None:
    cached, plain = pair
    params = dict(max_tokens=12, **CASES["sampled"])
    prompt = random_prompt(70, 30)
    generate(cached, prompt, cache_key="client-a", **params)
    assert cached.cached_prefix(prompt, "client-b") == 0
    other = generate(cached, prompt, cache_key="client-b", **params)
    assert other.last["n_cached"] == 0
    assert output(other) == output(generate(plain, prompt, **params))
    # a's slot still holds them for a
    assert generate(cached, prompt, cache_key="client-a", **params).last["n_cached"] == len(prompt)


@pytest.mark.parametrize("n", LENGTHS)
def test_a_slot_whose_rows_another_sequence_took_is_asked_again_exactly(make_engine, n: int) -> None:
    cached = make_engine(n_parallel=1, n_ctx=1024)
    plain = make_engine(n_parallel=1, n_ctx=1024, prefix_cache=False)
    params = dict(max_tokens=12, **CASES["sampled"])
    prompt = random_prompt(80 + n, n)
    want = output(generate(plain, prompt, **params))
    # a prompt that shares its start and replaces its last rows: the kept logits go
    generate(cached, prompt, **params)
    generate(cached, prompt[:-3] + random_prompt(81, 70)[1:], **params)
    got = generate(cached, prompt, **params)
    assert got.last["n_cached"] < n
    assert output(got) == want
    # one that continues it (by a whole tiled chunk, where the prompt is tiled): the
    # prompt's rows stay, but the slot keeps the logits of the longer prompt's end
    longer = prompt + random_prompt(82, 4 if n < 64 else 80)[1:]
    generate(cached, longer, **params)
    assert cached.cached_prefix(longer) == len(longer)
    got = generate(cached, prompt, **params)
    assert 0 < got.last["n_cached"] < n
    assert output(got) == want
    # an unrelated one takes the only slot
    generate(cached, random_prompt(83, n), **params)
    got = generate(cached, prompt, **params)
    assert got.last["n_cached"] == 0
    assert output(got) == want


def test_the_slots_keep_logits_within_their_budget_and_the_oldest_row_gives_way(make_engine) -> None:
    probe = make_engine(n_parallel=1, n_ctx=256)
    row = 4 * probe.n_vocab  # bytes
    cached = make_engine(n_parallel=4, n_ctx=256, kept_logits_bytes=2 * row + row // 2)  # two rows
    plain = make_engine(n_parallel=1, n_ctx=256, prefix_cache=False)
    params = dict(max_tokens=8, **CASES["sampled"])
    first, second, third = (random_prompt(90 + i, 20) for i in range(3))
    for prompt in (first, second, third):  # a free slot each; the third takes the first's row
        generate(cached, prompt, **params)
    got = generate(cached, first, **params)  # its KV is still there, its logits are not
    assert cached.cached_prefix(first) == 20 and got.last["n_cached"] < 20
    assert output(got) == output(generate(plain, first, **params))
    got = generate(cached, third, **params)  # kept
    assert got.last["n_cached"] == got.last["n_prompt"] == 20
    assert output(got) == output(generate(plain, third, **params))


def test_at_least_one_row_is_kept(make_engine) -> None:
    cached = make_engine(n_parallel=2, n_ctx=256, kept_logits_bytes=0)
    prompt = random_prompt(95, 20)
    generate(cached, prompt, max_tokens=4, temperature=0)
    assert generate(cached, prompt, max_tokens=4, temperature=0).last["n_cached"] == 20


@pytest.mark.parametrize("n", LENGTHS)
def test_a_resumed_sequence_of_the_prompt_does_not_start_from_its_logits(make_engine, n: int) -> None:
    cached = make_engine(n_parallel=1, n_ctx=1024)
    params = dict(max_tokens=40, **CASES["sampled"])
    prompt = random_prompt(85 + n, n)
    full = generate(cached, prompt, **params)
    seq = cached.submit(prompt, **params)  # asked again: from the kept logits
    take(cached, 5)
    snap = cached.snapshot(seq, with_kv=False)
    cached.cancel(seq)
    drain(cached, [seq])
    # the slot holds the prompt's KV and logits; a resume continues after its generated tokens
    resumed = generate(cached, prompt, resume=snap, **params)
    assert snap["generated"] + resumed.tokens == full.tokens
    assert snap["generated"] and resumed.logprobs == full.logprobs[len(snap["generated"]):]
    again = generate(cached, prompt, **params)
    assert again.last["n_cached"] == n
    assert output(again) == output(full)


def test_a_kv_prefix_handed_with_a_prompt_asked_again_is_not_loaded(make_engine) -> None:
    cached = make_engine(n_parallel=1, n_ctx=1024)
    plain = make_engine(n_parallel=1, n_ctx=1024, prefix_cache=False)
    params = dict(max_tokens=12, **CASES["sampled"])
    prompt = random_prompt(90, 100)
    seq = cached.submit(prompt, persist=True, **params)
    drain(cached, [seq])
    saved = cached.saved_prefix(seq)
    assert saved is not None and saved["tokens"] == prompt
    got = generate(cached, prompt, prefix=saved, **params)
    assert got.last["n_cached"] == len(prompt) and got.last["n_loaded"] == 0 and not got.last["prefix_refused"]
    assert output(got) == output(generate(plain, prompt, **params))


def test_eval_logits_drops_the_kept_logits_of_the_slot_it_uses(make_engine) -> None:
    cached = make_engine(n_parallel=1, n_ctx=1024)
    plain = make_engine(n_parallel=1, n_ctx=1024, prefix_cache=False)
    prompt = random_prompt(95, 20)
    generate(cached, prompt, max_tokens=4, temperature=0)
    cached.eval_logits(random_prompt(96, 20))
    got = generate(cached, prompt, max_tokens=8, temperature=0)
    assert got.last["n_cached"] == 0
    assert got.tokens == generate(plain, prompt, max_tokens=8, temperature=0).tokens


def test_without_batch_invariance_a_prompt_asked_again_continues_as_its_first_run(make_engine) -> None:
    # no fresh prefill to compare with (the bits depend on the batch): the kept
    # logits and KV are those the first run sampled from and continued
    engine = make_engine(n_parallel=2, n_ctx=1024, batch_invariant=False)
    params = dict(max_tokens=16, **CASES["sampled"])
    prompt = random_prompt(97, 100)
    first = generate(engine, prompt, **params)
    again = generate(engine, prompt, **params)
    assert again.last["n_cached"] == len(prompt)
    assert output(again) == output(first)
