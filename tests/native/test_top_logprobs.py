"""Log probabilities of generated tokens: the chosen token's and its position's most
likely tokens (``top_logprobs``), and each token's bytes (``token_bytes``)."""
from __future__ import annotations

import math

import pytest
from native_helpers import drain, generate, prompt_tokens

GREEDY = {"temperature": 0.0, "seed": 1}


def top_of(run) -> list[list[tuple[int, float]]]:
    return [alternatives for res in run.results for alternatives in res.get("top_logprobs", [])]


def test_top_logprobs_rank_the_tokens_of_each_position(engine):
    run = generate(engine, prompt_tokens(engine, "Once upon a time"), max_tokens=12, logprobs=True,
                   top_logprobs=5, **GREEDY)
    top = top_of(run)
    assert len(top) == len(run.tokens) == len(run.logprobs) > 0
    for token, logprob, alternatives in zip(run.tokens, run.logprobs, top):
        assert len(alternatives) == 5
        values = [lp for _, lp in alternatives]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-5
        # greedy: the chosen token is the most likely one, with the same log probability
        assert alternatives[0][0] == token and alternatives[0][1] == pytest.approx(logprob, abs=1e-5)


def test_no_top_logprobs_unless_asked_for(engine):
    prompt = prompt_tokens(engine, "Once upon a time")
    plain = generate(engine, prompt, max_tokens=4, logprobs=True, **GREEDY)
    assert plain.logprobs and not top_of(plain)
    # top_logprobs without logprobs hands out nothing
    assert not top_of(generate(engine, prompt, max_tokens=4, top_logprobs=3, **GREEDY))


def test_asking_for_top_logprobs_changes_nothing_else(engine):
    prompt = prompt_tokens(engine, "The weather today")
    params = {"max_tokens": 16, "temperature": 0.8, "seed": 5}
    seqs = [engine.submit(prompt, logprobs=True, **params), engine.submit(prompt, logprobs=True, top_logprobs=20,
                                                                           **params)]
    runs = drain(engine, seqs)
    assert (runs[seqs[0]].tokens, runs[seqs[0]].logprobs) == (runs[seqs[1]].tokens, runs[seqs[1]].logprobs)
    assert all(len(a) == 20 for a in top_of(runs[seqs[1]]))


def test_token_bytes_make_the_text(engine):
    run = generate(engine, prompt_tokens(engine, "Hello"), max_tokens=10, **GREEDY)
    assert b"".join(engine.token_bytes(t) for t in run.tokens).decode("utf-8") == run.text


@pytest.mark.parametrize("n", [-1, 21])
def test_top_logprobs_out_of_range_is_refused(engine, n):
    with pytest.raises(ValueError, match="top_logprobs"):
        engine.submit(prompt_tokens(engine, "Hi"), max_tokens=2, logprobs=True, top_logprobs=n)


def test_token_bytes_of_an_unknown_token_is_refused(engine):
    with pytest.raises(ValueError):
        engine.token_bytes(engine.n_vocab)
