"""Grammar-constrained sampling: the output of a (random) model held to a
GBNF grammar, as deterministic, batch invariant and resumable as any other
sequence; lazy grammars; JSON schemas through llama.cpp's converter."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from native_helpers import Run, drain, generate

from lmsp.native import Engine, schema_grammar

PROMPT = [1, 450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203, 29889]
CASES = {
    "greedy": dict(temperature=0),
    "sampled": dict(temperature=0.9, top_p=0.95, top_k=50, seed=17),
    "hot": dict(temperature=1.5, seed=3),
}
WORDS = {"gbnf": 'root ::= [a-z ]+ "."'}
ANSWER = {"gbnf": 'root ::= "yes" | "no" | "maybe"'}
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "grade": {"enum": ["low", "mid", "high"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["ok", "grade", "tags"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("case", CASES)
def test_the_output_is_a_sentence_of_the_grammar(engine: Engine, case: str) -> None:
    run = generate(engine, PROMPT, max_tokens=200, grammar=ANSWER, **CASES[case])
    assert run.finish == "stop"
    assert run.text in ("yes", "no", "maybe")
    words = generate(engine, PROMPT, max_tokens=300, grammar=WORDS, **CASES[case])
    assert re.fullmatch(r"[a-z ]+\.?", words.text), words.text
    if words.finish == "stop":  # the end of generation only where the grammar is complete
        assert words.text.endswith(".")


@pytest.mark.parametrize("case", CASES)
def test_a_json_schema_gives_json_that_validates(engine: Engine, case: str) -> None:
    import jsonschema
    grammar = {"gbnf": schema_grammar(json.dumps(SCHEMA))}
    run = generate(engine, PROMPT, max_tokens=300, grammar=grammar, **CASES[case])
    assert run.finish == "stop", run.text
    jsonschema.validate(json.loads(run.text), SCHEMA)


def test_constrained_and_free_sequences_batched_give_what_they_give_alone(make_engine) -> None:
    e = make_engine(n_parallel=4)
    alone_c = generate(e, PROMPT, max_tokens=40, grammar=WORDS, **CASES["sampled"])
    alone_f = generate(e, PROMPT, max_tokens=40, **CASES["sampled"])
    seqs = [
        e.submit(PROMPT, max_tokens=40, grammar=WORDS, **CASES["sampled"]),
        e.submit(PROMPT, max_tokens=40, **CASES["sampled"]),
        e.submit(PROMPT, max_tokens=40, grammar=WORDS, **CASES["sampled"]),
        e.submit(PROMPT, max_tokens=40, **CASES["sampled"]),
    ]
    runs = drain(e, seqs)
    assert runs[seqs[0]].tokens == runs[seqs[2]].tokens == alone_c.tokens
    assert runs[seqs[1]].tokens == runs[seqs[3]].tokens == alone_f.tokens
    assert alone_c.tokens != alone_f.tokens


def test_a_lazy_grammar_leaves_the_output_free_until_its_trigger(engine: Engine) -> None:
    free = generate(engine, PROMPT, max_tokens=30, **CASES["sampled"])
    never = {"gbnf": 'root ::= "x"', "lazy": True, "triggers": [{"type": "word", "value": "\x01never\x01"}]}
    assert generate(engine, PROMPT, max_tokens=30, grammar=never, **CASES["sampled"]).tokens == free.tokens
    # triggered by the free run's third token: the grammar holds from that token on
    k = 2
    trigger = free.tokens[k]
    while trigger in free.tokens[:k]:
        k += 1
        trigger = free.tokens[k]
    piece = engine.detokenize(free.tokens[: k + 1])[len(engine.detokenize(free.tokens[:k])) :]
    lazy = {
        "gbnf": f"root ::= {json.dumps(piece)} [0-9]+",
        "lazy": True,
        "triggers": [{"type": "token", "token": trigger}],
    }
    run = generate(engine, PROMPT, max_tokens=60, grammar=lazy, **CASES["sampled"])
    assert run.tokens[: k + 1] == free.tokens[: k + 1]
    rest = run.text[len(engine.detokenize(free.tokens[: k + 1])) :]
    assert re.fullmatch(r"[0-9]+", rest), rest


@pytest.mark.parametrize("with_kv", [False, True], ids=["prefill", "kv"])
def test_a_resumed_constrained_sequence_continues_exactly(make_engine, with_kv: bool) -> None:
    params = dict(CASES["hot"], max_tokens=48, grammar=WORDS)
    first = make_engine(n_parallel=1)
    full = generate(first, PROMPT, **params)
    assert len(full.tokens) > 12, "the case needs a longer output"
    seq = first.submit(PROMPT, **params)
    part = Run()
    while len(part.tokens) < 8:
        first.wait(60)
        for r in first.poll():
            part.tokens += r["tokens"]
            part.text += r["text"]
            part.finish = r["finish"]
    assert part.finish is None
    snap = first.snapshot(seq, with_kv=with_kv)
    first.cancel(seq)
    drain(first, [seq])
    first.close()
    second = make_engine(n_parallel=1)
    resume = {"generated": snap["generated"], "emitted": snap["emitted"], "kv_state": snap["kv_state"]}
    rest = generate(second, PROMPT, resume=resume, **params)
    assert snap["generated"] + rest.tokens == full.tokens
    assert snap["emitted"] + rest.text == full.text


def test_bad_grammars_are_refused(engine: Engine) -> None:
    with pytest.raises(ValueError, match="does not parse"):
        engine.submit(PROMPT, max_tokens=4, grammar={"gbnf": "root ::= ("})
    with pytest.raises(ValueError, match="needs at least one trigger"):
        engine.submit(PROMPT, max_tokens=4, grammar={"gbnf": 'root ::= "a"', "lazy": True})
    with pytest.raises(ValueError, match="does not fit the grammar"):
        free = generate(engine, PROMPT, max_tokens=3, temperature=0)
        engine.submit(PROMPT, max_tokens=8, grammar=ANSWER, resume={"generated": free.tokens, "emitted": free.text})
    with pytest.raises(ValueError, match="cannot be expressed"):
        schema_grammar(json.dumps({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}))
    with pytest.raises(ValueError, match="not JSON"):
        schema_grammar("{")



def test_a_prefill_the_grammar_does_not_take_is_refused(engine: Engine) -> None:
    with pytest.raises(ValueError, match="opening of the output"):
        engine.submit(PROMPT, max_tokens=4, grammar={"gbnf": 'root ::= "no"', "prefill": "yes, yes"})


@pytest.mark.parametrize("most", [1, 3, None])
def test_parallel_calls_are_valid_calls_up_to_the_limit(engine: Engine, most: int | None) -> None:
    """The service's calls grammar (lmsp.runtime.constraints) on the random model: one
    call per line, each valid against its tool's schema, never more than allowed."""
    import jsonschema
    from lmsp import calls
    from lmsp.runtime import constraints

    city = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
            "additionalProperties": False}
    request = {"tools": [{"type": "function", "name": "get_weather", "parameters": city}],
               "tool_choice": "required", "max_output_tokens": 400,
               "parallel_tool_calls": most != 1, "max_tool_calls": most if most != 1 else None}
    counts = set()
    for seed in range(6):
        run = generate(engine, PROMPT, max_tokens=400, grammar=constraints.grammar(request), temperature=1.5,
                       seed=seed)
        assert run.finish == "stop", run.text
        made = calls.split_all(run.text)
        made_again = "".join(calls.as_text(name, args) for name, args in made)
        assert made and re.sub(r"\s", "", made_again) == re.sub(r"\s", "", run.text)
        for _, args in made:
            jsonschema.validate(json.loads(args), city)
        counts.add(len(made))
    if most == 1:
        assert counts == {1}
    else:  # this random model makes several calls for some of these seeds
        assert 1 < max(counts) <= (most or 400)


def test_a_grammar_that_allows_no_next_token_fails_the_sequence_at_once(engine: Engine) -> None:
    """After the brace the grammar allows nothing (an empty range): the sequence ends
    with ``grammar_dead_end`` at that step, not at ``max_tokens``."""
    run = generate(engine, PROMPT, max_tokens=50, grammar={"gbnf": 'root ::= "{" [5-2]'}, temperature=0)
    assert (run.finish, run.last["code"]) == ("error", "grammar_dead_end")
    assert run.text == "{" and run.last["n_generated"] == 1
    free = generate(engine, PROMPT, max_tokens=3, temperature=0)
    assert "code" not in free.last  # an end without an error has no code


def test_check_grammar_refuses_what_a_submit_would(engine: Engine) -> None:
    from lmsp.native import check_grammar

    check_grammar('root ::= "a" b*\nb ::= [0-9]')
    for gbnf, why in [("root ::= (", "does not parse"), ("root ::= root | \"a\"", "begins with itself"),
                      ('root ::= ("a"{0,40}){60}', "does not parse"), ('root ::= b', "does not parse"),
                      ('root ::= "a"{5,2}', "fewer times at most")]:
        with pytest.raises(ValueError, match=why):
            check_grammar(gbnf)
        with pytest.raises(ValueError):
            engine.submit(PROMPT, max_tokens=4, grammar={"gbnf": gbnf})


REPEAT_CHILD = """
import sys
from lmsp.native import Engine
e = Engine(sys.argv[1], n_ctx=128, n_parallel=1, n_threads=1)
for gbnf in ('root ::= "a"{5,2}', 'root ::= ("ab" | "c"){ 3 , 1 }'):
    try:
        e.submit([1, 450], max_tokens=4, grammar={"gbnf": gbnf})
        print("accepted")
    except ValueError as exc:
        print(exc)
"""


def test_a_repetition_fewer_times_at_most_than_at_least_is_refused(demo_model_path) -> None:
    """llama.cpp's parser would count down from {5,2} for ever, holding the caller
    (and the GIL): refused first. In a child, so that a hang fails instead of stopping the run."""
    out = subprocess.run([sys.executable, "-c", REPEAT_CHILD, str(demo_model_path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["the grammar repeats {5,2}: fewer times at most than at least",
                                       "the grammar repeats { 3 , 1 }: fewer times at most than at least"]
