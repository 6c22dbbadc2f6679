"""Log probabilities under a grammar: each token's distribution is the model's
restricted to the tokens the grammar allows at its position, renormalized;
the model's logits (``eval_logits``) and the grammar worked out here give
the same numbers. Asking for them changes no token, and they are as batch
invariant and resumable as the tokens."""
from __future__ import annotations

import math

import numpy as np
import pytest
from native_helpers import Run, drain, generate

from lmsp.native import Engine

PROMPT = [1, 450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203, 29889]
ANSWERS = ("yes", "no", "maybe", "perhaps not")
ANSWER = {"gbnf": "root ::= " + " | ".join(f'"{a}"' for a in ANSWERS)}
WORDS = {"gbnf": 'root ::= [a-z ]+ "."'}
CASES = {"greedy": dict(temperature=0), "hot": dict(temperature=1.5, seed=3)}
TOP = 20


def tops(run: Run) -> list[list[tuple[int, float]]]:
    return [alternatives for res in run.results for alternatives in res.get("top_logprobs", [])]


def allowed_answer_tokens(engine: Engine, pieces: list[bytes], text: bytes) -> np.ndarray:
    """The tokens that ANSWER allows after ``text`` (a strict prefix of an answer)."""
    ok = [i for i, p in enumerate(pieces) if p and any(a.encode().startswith(text + p) for a in ANSWERS)]
    return np.array(ok)


@pytest.fixture(scope="module")
def pieces(engine: Engine) -> list[bytes]:
    return [bytes(engine.token_bytes(t)) for t in range(engine.n_vocab)]


@pytest.mark.parametrize("case", CASES)
def test_the_distribution_is_the_model_s_over_the_allowed_tokens(engine: Engine, pieces, case: str) -> None:
    run = generate(engine, PROMPT, max_tokens=20, grammar=ANSWER, logprobs=True, top_logprobs=TOP, **CASES[case])
    assert run.finish == "stop" and run.text in ANSWERS
    assert len(run.logprobs) == len(run.tokens) == len(tops(run)) > 0
    logits = engine.eval_logits(PROMPT + run.tokens)
    text = b""
    for i, (token, logprob, alternatives) in enumerate(zip(run.tokens, run.logprobs, tops(run))):
        allowed = allowed_answer_tokens(engine, pieces, text)
        row = logits[len(PROMPT) - 1 + i].astype(np.float64)
        norm = np.log(np.sum(np.exp(row[allowed] - row[allowed].max()))) + row[allowed].max()
        assert logprob == pytest.approx(row[token] - norm, abs=2e-3)
        # every alternative is an allowed token, the likeliest first, and together
        # they are every allowed token where there are fewer than TOP: a sum of 1
        assert {t for t, _ in alternatives} <= set(allowed.tolist())
        assert len(alternatives) == min(TOP, len(allowed))
        values = [lp for _, lp in alternatives]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        total = sum(math.exp(v) for v in values)
        assert total <= 1 + 1e-5
        if len(allowed) <= TOP:
            assert total == pytest.approx(1.0, abs=1e-4)
        if case == "greedy":
            assert alternatives[0] == (token, logprob)
        text += pieces[token]


def test_a_forbidden_token_never_shows(engine: Engine) -> None:
    run = generate(engine, PROMPT, max_tokens=40, grammar=WORDS, logprobs=True, top_logprobs=TOP, **CASES["hot"])
    assert run.tokens
    for alternatives in tops(run):
        for token, _ in alternatives:
            piece = engine.token_bytes(token).decode("utf-8", errors="replace")
            assert piece and all(c in "abcdefghijklmnopqrstuvwxyz ." for c in piece), piece


@pytest.mark.parametrize("case", CASES)
def test_asking_for_them_changes_no_token(engine: Engine, case: str) -> None:
    plain = generate(engine, PROMPT, max_tokens=40, grammar=WORDS, **CASES[case])
    asked = generate(engine, PROMPT, max_tokens=40, grammar=WORDS, logprobs=True, top_logprobs=5, **CASES[case])
    assert asked.tokens == plain.tokens and asked.text == plain.text


def test_batched_they_are_what_they_are_alone(make_engine) -> None:
    e = make_engine(n_parallel=3)
    params = dict(max_tokens=30, grammar=WORDS, logprobs=True, top_logprobs=4, **CASES["hot"])
    alone = generate(e, PROMPT, **params)
    seqs = [e.submit(PROMPT, **params), e.submit(PROMPT, max_tokens=30, **CASES["hot"]), e.submit(PROMPT, **params)]
    runs = drain(e, seqs)
    for seq in (seqs[0], seqs[2]):
        assert (runs[seq].tokens, runs[seq].logprobs, tops(runs[seq])) == (alone.tokens, alone.logprobs, tops(alone))


def test_a_resumed_sequence_gives_the_same_ones(make_engine) -> None:
    params = dict(max_tokens=40, grammar=WORDS, logprobs=True, top_logprobs=3, **CASES["hot"])
    first = make_engine(n_parallel=1)
    full = generate(first, PROMPT, **params)
    assert len(full.tokens) > 12, "the case needs a longer output"
    seq = first.submit(PROMPT, **params)
    part = Run()
    while len(part.tokens) < 8:
        first.wait(60)
        for r in first.poll():
            part.results.append(r)
            part.tokens += r["tokens"]
            part.logprobs += r.get("logprobs", [])
            part.finish = r["finish"]
    assert part.finish is None
    snap = first.snapshot(seq)
    first.cancel(seq)
    drain(first, [seq])
    first.close()
    n = len(snap["generated"])
    rest = generate(make_engine(n_parallel=1), PROMPT, resume={"generated": snap["generated"],
                                                                "emitted": snap["emitted"]}, **params)
    assert snap["generated"] + rest.tokens == full.tokens
    assert part.logprobs == full.logprobs[: len(part.logprobs)] and rest.logprobs == full.logprobs[n:]
    assert tops(part) == tops(full)[: len(part.tokens)] and tops(rest) == tops(full)[n:]


def test_a_token_is_drawn_from_the_distribution_they_report(engine: Engine, pieces) -> None:
    """At temperature 1, a constrained token's frequency over many seeds is its
    probability among the allowed tokens, the one its entry reports. The grammar
    forbids the likeliest tokens (" expected" here), so that the sampler's first
    pick is often refused: a second draw on the same counter as the first would
    give "reno" about 0.85 of the time and "riers" 0.14, instead of 0.81 and 0.19.
    The draws are counted without log probabilities (each asks for the whole
    vocabulary to be checked against the grammar); asking for them draws the
    same tokens, as the first seeds show."""
    grammar = {"gbnf": 'root ::= "r" [a-z]*'}
    row = engine.eval_logits(PROMPT)[-1].astype(np.float64)
    allowed = np.array([bool(p) and p[:1] == b"r" and all(97 <= c <= 122 for c in p) for p in pieces])
    weights = np.where(allowed, np.exp(row - row.max()), 0.0)
    wanted = weights / weights.sum()
    n, n_reported = 3000, 200
    seqs = [engine.submit(PROMPT, max_tokens=1, grammar=grammar, temperature=1.0, seed=s) for s in range(n)]
    runs = drain(engine, seqs)
    with_logprobs = [engine.submit(PROMPT, max_tokens=1, grammar=grammar, temperature=1.0, seed=s, logprobs=True,
                                   top_logprobs=TOP) for s in range(n_reported)]
    reports = drain(engine, with_logprobs)
    assert [reports[s].tokens for s in with_logprobs] == [runs[s].tokens for s in seqs[:n_reported]]
    [reported] = tops(reports[with_logprobs[0]])
    assert [t for t, _ in reported] == list(np.argsort(-wanted, kind="stable")[: len(reported)])
    assert all(math.exp(lp) == pytest.approx(wanted[t], abs=1e-3) for t, lp in reported)
    counts = np.bincount([runs[s].tokens[0] for s in seqs], minlength=engine.n_vocab)
    assert not counts[~allowed].any()
    for token in np.argsort(-wanted)[:2]:  # "reno" and "riers"
        p = wanted[token]
        assert abs(counts[token] / n - p) < 4 * math.sqrt(p * (1 - p) / n), (pieces[token], counts[token] / n, p)
