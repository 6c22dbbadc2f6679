"""A prompt asked again on the catalog's real models (test_repeated_prompt.py
on the demo model): a chat of some 400 tokens, constrained to a JSON schema
or free, asked twice, answers the second time with nothing prefilled and
exactly as an engine without the prefix cache answers, log probabilities
included. SmolLM2 has row-wise Q4_1 weights; Gemma 3 has K-quant weights
(ggml's reference kernels for one-row steps) and sliding-window layers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from native_helpers import N_GPU_LAYERS, Run, generate

from lmsp.native import Engine, schema_grammar

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(N_GPU_LAYERS != 0, reason="exactness needs the batch-invariant CPU backend"),
]

MODELS = ["smollm2-135m-instruct", "gemma-3-270m"]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "email": {"type": "string", "maxLength": 60},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "membership": {"enum": ["none", "silver", "gold", "platinum"]},
    },
    "required": ["name", "email", "age", "membership"],
    "additionalProperties": False,
}
SYSTEM = ("You are the assistant of a small online shop. You create customer records with the tool "
          "create_customer, whose arguments are a JSON object with the customer's name, email address, age "
          "and membership level. " * 8)
QUESTION = "Make up a customer record for a new customer: a name, an email address, an age and a level."
CASES = {
    "greedy": dict(temperature=0),
    "sampled": dict(temperature=0.9, top_k=40, top_p=0.95, seed=11, logprobs=True, top_logprobs=5),
    "schema": dict(temperature=0, logprobs=True, top_logprobs=3, grammar="schema"),
    "schema sampled": dict(temperature=0.8, seed=5, logprobs=True, grammar="schema"),
}


@pytest.fixture(scope="module", params=MODELS)
def model_path(request, catalog_model) -> Path:
    return catalog_model(request.param)


@pytest.fixture(scope="module")
def pair(model_path: Path):
    """An engine with the prefix cache and one without (module-wide: each test leaves them idle)."""
    engines = [Engine(str(model_path), n_ctx=2048, n_parallel=2, n_threads=1, prefix_cache=cache)
               for cache in (True, False)]
    yield engines
    for engine in engines:
        engine.close()


def output(run: Run) -> tuple:
    tops = [alternatives for res in run.results for alternatives in res.get("top_logprobs", [])]
    return run.tokens, run.text, run.logprobs, tops, run.finish


@pytest.mark.parametrize("case", list(CASES))
def test_a_chat_asked_again_prefills_nothing_and_answers_as_a_prefill(pair, case: str) -> None:
    cached, plain = pair
    params = dict(CASES[case], max_tokens=32)
    if params.get("grammar") == "schema":
        params["grammar"] = {"gbnf": schema_grammar(json.dumps(SCHEMA))}
    prompt = cached.chat_prompt([{"role": "system", "content": SYSTEM + case},
                                 {"role": "user", "content": QUESTION}])
    assert len(prompt) > 350
    first = generate(cached, prompt, **params)
    assert first.tokens
    before = cached.stats()["tokens_decoded"]
    again = generate(cached, prompt, **params)
    assert again.last["n_cached"] == again.last["n_prompt"] == len(prompt)
    assert cached.stats()["tokens_decoded"] - before == len(again.tokens) - (again.finish == "length")
    assert output(again) == output(first) == output(generate(plain, prompt, **params))
    if "grammar" in params and again.finish == "stop":
        assert set(json.loads(again.text)) == set(SCHEMA["properties"])
