"""Log probabilities of a schema-constrained output on SmolLM2: every alternative
is a token the grammar allows at its position (the grammar itself says so: a
resumed sequence whose tokens it does not take is refused), their
probabilities sum to at most 1, a greedy token is its position's likeliest,
and a resumed sequence gives the same ones."""
from __future__ import annotations

import json
import math

import pytest
from native_helpers import N_GPU_LAYERS, Run, drain, generate

from lmsp.native import Engine, schema_grammar

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(N_GPU_LAYERS != 0, reason="exactness needs the batch-invariant CPU backend"),
]

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "sunny": {"type": "boolean"}},
    "required": ["city", "sunny"],
    "additionalProperties": False,
}
QUESTION = [{"role": "user", "content": "Is it sunny in Paris today? Answer in JSON."}]
TOP = 5


@pytest.fixture(scope="module")
def engine(smollm2_path) -> Engine:
    e = Engine(str(smollm2_path), n_ctx=1024, n_parallel=2, n_threads=2)
    yield e
    e.close()


def tops(run: Run) -> list[list[tuple[int, float]]]:
    return [alternatives for res in run.results for alternatives in res.get("top_logprobs", [])]


def allowed(engine: Engine, prompt: list[int], grammar: dict, before: list[int], token: int) -> bool:
    """Whether the grammar takes ``token`` after ``before``."""
    try:
        seq = engine.submit(prompt, max_tokens=1, grammar=grammar, resume={"generated": before + [token]})
    except ValueError as exc:
        assert "does not fit the grammar" in str(exc)
        return False
    engine.cancel(seq)
    drain(engine, [seq])
    return True


@pytest.mark.parametrize("params", [dict(temperature=0), dict(temperature=1.0, seed=4)], ids=["greedy", "sampled"])
def test_a_schema_constrained_output_s_log_probabilities(engine: Engine, params: dict) -> None:
    grammar = {"gbnf": schema_grammar(json.dumps(SCHEMA))}
    prompt = engine.chat_prompt(QUESTION)
    run = generate(engine, prompt, max_tokens=40, grammar=grammar, logprobs=True, top_logprobs=TOP, **params)
    assert run.finish == "stop" and set(json.loads(run.text)) == {"city", "sunny"}
    assert len(tops(run)) == len(run.tokens) == len(run.logprobs)
    for i, (token, logprob, alternatives) in enumerate(zip(run.tokens, run.logprobs, tops(run))):
        assert sum(math.exp(lp) for _, lp in alternatives) <= 1 + 1e-5
        assert logprob <= 0
        assert (token, logprob) in alternatives or logprob <= alternatives[-1][1]  # not among them: less likely
        if params["temperature"] == 0:
            assert alternatives[0] == (token, logprob)
        for alt, _ in alternatives:
            assert allowed(engine, prompt, grammar, run.tokens[:i], alt), (i, alt)
    # replayed, and resumed part way: the same tokens and the same log probabilities
    again = generate(engine, prompt, max_tokens=40, grammar=grammar, logprobs=True, top_logprobs=TOP, **params)
    assert (again.tokens, again.logprobs, tops(again)) == (run.tokens, run.logprobs, tops(run))
    k = len(run.tokens) // 2
    text = engine.detokenize(run.tokens[:k])
    rest = generate(engine, prompt, max_tokens=40, grammar=grammar, logprobs=True, top_logprobs=TOP,
                    resume={"generated": run.tokens[:k], "emitted": text}, **params)
    assert (rest.tokens, rest.logprobs, tops(rest)) == (run.tokens[k:], run.logprobs[k:], tops(run)[k:])
