"""The engine's contracts on the real models of the catalog, where the output
matters: batch invariance on the CPU, the prefix cache and snapshot/resume.

SmolLM2 has Q4_1 weights (row-wise kernels); Gemma 3 has K-quant weights, on
which a batch-invariant engine runs ggml's reference kernels for one-row
steps and tiled kernels for long prompts (csrc/batch_plan.cpp). The demo
model's tests (test_engine.py, test_prefix_cache.py, test_resume.py) check
the same contracts on random weights."""
from __future__ import annotations

from pathlib import Path

import pytest
from native_helpers import CATALOG_MODELS, SAMPLING_CASES, N_GPU_LAYERS, Run, Watch, drain, generate, take

from lmsp.native import Engine

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(N_GPU_LAYERS != 0, reason="exactness needs the batch-invariant CPU backend"),
]

MODELS, CASES = CATALOG_MODELS, SAMPLING_CASES
QUESTION = [{"role": "user", "content": "Write three sentences about the sea."}]
SYSTEM = ("You are a patient teacher. Answer in plain words, in short sentences, without lists, "
          "and keep every answer under a hundred words. Never use markup of any kind. When you do not "
          "know something, say so, and say what would help you find out.")
NEIGHBOURS = [
    [{"role": "user", "content": "Hi"}],
    # longer than the engine's prefill chunk: prefilled over several steps,
    # in tiled chunks on K-quant weights, while the others decode
    [{"role": "user", "content": "Summarise this. " + "The river runs to the sea, and the sea is wide. " * 40}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Name a colour."}],
]


@pytest.fixture(scope="module", params=MODELS)
def model_path(request, catalog_model) -> Path:
    return catalog_model(request.param)


@pytest.fixture
def make(model_path: Path):
    made: list[Engine] = []

    def build(**kwargs) -> Engine:
        kwargs.setdefault("n_ctx", 4096)
        kwargs.setdefault("n_parallel", 4)
        kwargs.setdefault("n_threads", 1)
        engine = Engine(str(model_path), **kwargs)
        made.append(engine)
        return engine

    yield build
    for engine in made:
        engine.close()


def chat(engine: Engine, messages: list[dict]) -> list[int]:
    return engine.chat_prompt(messages)


@pytest.mark.parametrize("case", list(CASES))
def test_alone_and_batched_give_the_same_tokens_and_log_probabilities(make, case: str) -> None:
    engine = make()
    params = CASES[case]
    prompt = chat(engine, QUESTION)
    alone = generate(engine, prompt, max_tokens=40, logprobs=True, **params)
    assert alone.tokens, "the model answered nothing"
    others = [chat(engine, m) for m in NEIGHBOURS]
    seqs = [engine.submit(others[0], max_tokens=40, **params), engine.submit(others[1], max_tokens=40, **params)]
    seqs.insert(1, engine.submit(prompt, max_tokens=40, logprobs=True, **params))
    seqs.append(engine.submit(others[2], max_tokens=40, **params))
    batched = drain(engine, seqs)[seqs[1]]
    assert (batched.tokens, batched.text) == (alone.tokens, alone.text)
    assert batched.logprobs == alone.logprobs  # bitwise: the same logits, whatever ran beside


@pytest.mark.parametrize("case", list(CASES))
def test_the_next_turn_prefills_only_what_is_new_and_answers_as_a_full_prefill(make, case: str) -> None:
    cached, plain = make(n_parallel=2), make(n_parallel=2, prefix_cache=False)
    params = CASES[case]
    # a first turn of 64 tokens or more: prompts that long are prefilled in
    # tiled steps, and a cached prefix is reused only where it was computed
    # as a prefill of the next turn would compute it (csrc/slot_choice.cpp)
    opening = [{"role": "system", "content": SYSTEM}] + QUESTION
    first_prompt = chat(cached, opening)
    assert len(first_prompt) >= 64
    first = generate(cached, first_prompt, max_tokens=24, **params)
    turn = opening + [
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "Now one about rivers."},
    ]
    follow_up = chat(cached, turn)
    shared = next((i for i, (a, b) in enumerate(zip(first_prompt + first.tokens, follow_up)) if a != b),
                  min(len(first_prompt) + len(first.tokens), len(follow_up)))
    second = generate(cached, follow_up, max_tokens=24, **params)
    assert 0 < second.last["n_cached"] <= shared
    want = generate(plain, follow_up, max_tokens=24, **params)
    assert want.last["n_cached"] == 0
    assert (second.tokens, second.text) == (want.tokens, want.text)


def _interrupted(engine: Engine, prompt: list[int], params: dict, after: int, with_kv: bool) -> dict:
    seq = engine.submit(prompt, max_tokens=4096, **params)
    run = Run()
    while len(run.tokens) < after:
        engine.wait(60)
        for result in engine.poll():
            run.tokens += result["tokens"]
            run.text += result["text"]
            assert result["finish"] is None, f"the answer ended after {len(run.tokens)} tokens"
    snap = engine.snapshot(seq, with_kv=with_kv)
    assert snap["generated"][:len(run.tokens)] == run.tokens
    assert engine.cancel(seq)
    drain(engine, [seq])
    return snap


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_kv", [True, False], ids=["kv", "prefill"])
def test_a_snapshot_resumed_in_a_new_engine_continues_the_uninterrupted_output(make, case: str,
                                                                                with_kv: bool) -> None:
    params = CASES[case]
    first = make(n_parallel=2)
    prompt = chat(first, QUESTION)
    snap = _interrupted(first, prompt, params, after=10, with_kv=with_kv)
    max_tokens = len(snap["generated"]) + 20
    full = generate(first, prompt, max_tokens=max_tokens, **params)
    first.close()
    second = make(n_parallel=2)
    neighbour = second.submit(chat(second, NEIGHBOURS[2]), max_tokens=20, temperature=0)
    seq = second.submit(prompt, max_tokens=max_tokens, resume=snap, **params)
    resumed = drain(second, [neighbour, seq])[seq]
    assert snap["generated"] + resumed.tokens == full.tokens
    assert snap["emitted"] + resumed.text == full.text


def test_a_long_prompt_meets_running_streams_in_short_tiled_steps(make) -> None:
    """While other sequences decode, a tiled step takes at most 128 rows of a prompt, so
    a running stream waits for one short step between two of its tokens; alone, the
    prompt goes in chunks of up to 256 rows. Its answer is the same either way."""
    first = make()  # an engine of its own: the other would find the prompt in its prefix cache
    long = chat(first, NEIGHBOURS[1])
    alone = generate(first, long, max_tokens=4, temperature=0)
    alone_steps = first.stats()["tiled_steps"]
    engine = make()
    endless = {"gbnf": 'root ::= "sea " root'}  # a stream that runs until cancelled
    running = engine.submit(chat(engine, QUESTION), max_tokens=4000, temperature=0, grammar=endless)
    take(engine, 2)
    before = engine.stats()["tiled_steps"]
    seq = engine.submit(long, max_tokens=4, temperature=0)
    watch = Watch(engine)
    watch.until(lambda: seq in watch.ended)
    steps = engine.stats()["tiled_steps"] - before
    assert watch.got[seq] == alone.tokens
    assert running not in watch.ended and watch.tokens[running] >= steps - 1  # a token between two steps
    assert 0 < alone_steps <= -(-len(long) // 256) < len(long) // 128 <= steps
    engine.cancel(running)


def test_prompts_that_arrive_together_start_decoding_together(make) -> None:
    """Prompts that meet no running stream are prefilled back to back, up to a
    batch of rows, before the streams they started take their second token:
    a burst of requests decodes in step instead of each new stream waiting
    for the next prompt's tiled step between its first tokens. Past the batch,
    the kinds of steps take turns again. The answers are those alone."""
    def summarise(k: int) -> list[dict]:
        text = "The river runs to the sea, and the sea is wide. " * k
        return [{"role": "user", "content": "Summarise this. " + text}]

    ref = make(n_parallel=1)
    prompts = [chat(ref, summarise(k)) for k in (21, 5, 6)]
    lengths = [len(p) for p in prompts]
    # one prompt past 256 rows, all three within 1024, each tiled (64 rows or more)
    assert lengths[0] > 256 and sum(lengths) < 1024 and min(lengths) >= 64, lengths
    alone_runs = [generate(ref, p, max_tokens=3, temperature=0) for p in prompts]
    alone = [run.tokens for run in alone_runs]
    # tokens sampled (an end of text is sampled but not given): one from the prompt's
    # last row, the others from one-row steps
    samples = max(len(run.tokens) + (run.finish == "stop") for run in alone_runs)
    assert samples >= 2, "every answer ended on its first token"
    one_row_steps = {}
    for n_batch in (1024, 256):
        engine = make(n_parallel=3, n_batch=n_batch)
        before = engine.stats()
        seqs = [engine.submit(p, max_tokens=3, temperature=0) for p in prompts]
        runs = drain(engine, seqs)
        after = engine.stats()
        assert [runs[s].tokens for s in seqs] == alone
        one_row_steps[n_batch] = (after["steps"] - before["steps"]) - (after["tiled_steps"] - before["tiled_steps"])
    assert one_row_steps[1024] == samples - 1  # the later tokens of all three, side by side
    assert one_row_steps[256] > samples - 1  # the first stream's second token came before the next prompt
