"""lmsp.native.quantize, and batch invariance on the models it makes.

K-quant weights (q4_k_m and its kin, the most common downloads) are where
ggml's CPU backend has a tiled matmul for 8 or more rows, summing in another
order than the one-row path: without the engine's reference kernels a
sequence's logits would depend on how many rows were computed with it.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from native_helpers import N_GPU_LAYERS, drain, generate, random_prompt, take

from lmsp import _native
from lmsp.models.demo import write_demo_model
from lmsp.native import QUANTIZE_TYPES, Engine, ModelFormatError, NativeError, quantize, read_gguf_info, system_info


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory, small_shape: dict) -> Path:
    """The small shape (rows of 256 and 768: whole K-quant blocks) in two layers."""
    return write_demo_model(tmp_path_factory.mktemp("quantized") / "small.gguf", **{**small_shape, "n_layer": 2})


@pytest.fixture(scope="module")
def quantized(small_model: Path):
    """``quantized(type)``: the small model in that type, made once per module."""
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            made[kind] = small_model.with_name(f"small-{kind}.gguf")
            quantize(small_model, made[kind], kind)
        return made[kind]

    return get


@pytest.fixture(scope="module")
def kquant_model(quantized) -> Path:
    return quantized("q4_k_m")


def test_quantize_writes_the_type_it_was_asked_for(kquant_model: Path) -> None:
    info = read_gguf_info(kquant_model)
    assert info["quantization"] == "Q4_K_M"
    assert info["size_bytes"] < (kquant_model.parent / "small.gguf").stat().st_size / 2
    assert not [p.name for p in kquant_model.parent.iterdir() if ".part" in p.name]
    assert {"q4_k_m", "q8_0", "q6_k", "f16"} <= set(QUANTIZE_TYPES)


def test_quantize_refuses_bad_arguments(demo_model_path: Path, kquant_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.gguf"
    with pytest.raises(ValueError, match="unknown quantization type 'q9'.*known: f16"):
        quantize(demo_model_path, out, "q9")
    with pytest.raises(FileNotFoundError):
        quantize(tmp_path / "missing.gguf", out, "q8_0")
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(ModelFormatError):
        quantize(tmp_path / "text.gguf", out, "q8_0")
    with pytest.raises(ValueError, match="n_threads"):
        quantize(demo_model_path, out, "q8_0", n_threads=-1)
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(demo_model_path.read_bytes())
    with pytest.raises(ValueError, match="overwrite the model itself"):
        quantize(copy, copy, "q8_0")
    assert copy.read_bytes() == demo_model_path.read_bytes()
    with pytest.raises(ValueError, match="already quantized"):
        quantize(kquant_model, out, "q8_0")
    with pytest.raises(NativeError, match="could not quantize"):
        quantize(demo_model_path, tmp_path / "no" / "such" / "dir.gguf", "q8_0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.gguf", "text.gguf"]


def _engine(path: Path, **kwargs) -> Engine:
    kwargs.setdefault("n_ctx", 512)
    kwargs.setdefault("n_threads", 1)
    return Engine(str(path), n_gpu_layers=N_GPU_LAYERS, **kwargs)


cpu_only = pytest.mark.skipif(N_GPU_LAYERS != 0, reason="exactness needs the batch-invariant CPU backend")


# the float and legacy block types take the one-row path anyway; the K-quants and
# i-quants only with the reference kernels the engine then turns on
@cpu_only
@pytest.mark.parametrize("kind", ["f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q6_k", "iq4_xs"])
def test_logits_do_not_depend_on_the_batch_whatever_the_weights(quantized, kind: str) -> None:
    tokens = random_prompt(4, 80)
    with _engine(quantized(kind), n_parallel=1) as engine:
        # llama.cpp's q4_0 writes the output matrix in q6_k
        assert engine.info["reference_kernels"] is (kind in ("q4_0", "q4_k_m", "q6_k", "iq4_xs"))
        logits = engine.eval_logits(tokens)  # 80 rows in one batch
        for n in (1, 7, 8, 33):
            np.testing.assert_array_equal(engine.eval_logits(tokens[:n]), logits[:n])


def test_the_module_is_built_without_amx_kernels() -> None:
    # at the pinned source ggml's AMX matmul loads a tile configuration the
    # compiler never wrote and dies with SIGSEGV (CMakeLists.txt); the test
    # below reaches it on an AMX machine
    assert "AMX_INT8 = 1" not in system_info()


@cpu_only
def test_without_invariance_a_kquant_models_rows_differ(kquant_model: Path) -> None:
    """What the test above guards against: on a CPU with ggml's tiled or
    repacked K-quant paths (x86 with AVX2), batch_invariant=False gives rows
    that depend on the batch."""
    if "AVX2 = 1" not in system_info():
        # the contrast needs ggml's tiled or repacked K-quant paths; the invariance
        # itself is checked on every CPU by the test above
        pytest.skip("this CPU has no AVX2: ggml takes no batch-dependent K-quant path here")
    tokens = random_prompt(4, 80)
    with _engine(kquant_model, n_parallel=1, batch_invariant=False) as fast:
        assert fast.info["reference_kernels"] is False
        whole = fast.eval_logits(tokens)
        assert not all(np.array_equal(fast.eval_logits(tokens[:n]), whole[:n]) for n in (1, 7))


@cpu_only
def test_kquant_prompts_take_the_tiles_where_they_replace_ggmls_tiled_matmul(kquant_model: Path) -> None:
    """Where the tiles take the K-quant products of 8 rows or more that ggml's
    tiled matmul would (tile_matmul.cpp: ARM, and x86 without AVX-512 VNNI), a
    prompt's products go through them, and with the tiles off through vec_dot
    row by row: the same bits either way. Elsewhere ggml's tiled matmul keeps
    them, tiles or not (this model's matrices are all q4_K and q6_K). A prompt
    of 40 tokens is prefilled in one tiled step; its last row gives the first
    token's log probabilities."""

    def first_token(engine: Engine) -> tuple[int, list[float], list]:
        run = generate(engine, random_prompt(4, 40), max_tokens=1, logprobs=True, top_logprobs=20, temperature=0.0)
        return run.tokens[0], run.logprobs, run.results[0]["top_logprobs"]

    with _engine(kquant_model, n_parallel=1, prefix_cache=False) as engine:
        first_token(engine)  # warm: the counter below sees the prompt's step alone
        before = _native.tile_matmul_products()
        tiled = first_token(engine)
        took = _native.tile_matmul_products() - before
        _native.set_tile_matmul(False)
        try:
            plain = first_token(engine)
        finally:
            _native.set_tile_matmul(True)
    assert (took > 0) is (_native.TILE_MATMUL_BUILT and _native.TILE_MATMUL_KQUANTS_FIRST)
    assert tiled == plain


SAMPLED = dict(seed=5, temperature=0.9, top_k=40)
CASES = {"greedy": dict(temperature=0), "sampled": SAMPLED}


@cpu_only
@pytest.mark.parametrize(("kind", "case", "chunk", "batch"), [
    *[(kind, case, chunk, 512) for kind in ("q4_k_m", "iq4_xs") for case in CASES for chunk in (256, 16)],
    ("q4_k_m", "sampled", 16, 64),  # batches under 128 rows: no tiled attention, a bf16 V cache
])
def test_a_kquant_sequence_alone_and_among_eight_others(quantized, kind: str, case: str, chunk: int,
                                                        batch: int) -> None:
    """Prompts of 8 tokens or more are prefilled by the tiled kernel in steps
    of their own, in chunks of 8 rows or more; every other row (decoding, a
    prompt of 5) by the one-row kernel. With 16-token chunks the 37-token
    prompt is cut 16 + 13 + 8, never leaving a tail of fewer than 8. The
    neighbours' prompts of 64 tokens or more take the tiled attention too,
    where batches hold 128 rows or more."""
    params = CASES[case]
    prompt = random_prompt(0, 37)
    with _engine(quantized(kind), n_parallel=9, prefill_chunk=chunk, n_batch=batch) as engine:
        assert engine.info["reference_kernels"]
        alone = generate(engine, prompt, max_tokens=24, logprobs=True, **params)
        # nine rows per decoding step, and neighbours still prefilling among them
        seqs = [engine.submit(random_prompt(10 + i, 5 + 20 * i), max_tokens=24, **params) for i in range(8)]
        seqs.insert(4, engine.submit(prompt, max_tokens=24, logprobs=True, **params))
        runs = drain(engine, seqs)
    # the log probabilities, to the last bit: the logits were the same
    assert (runs[seqs[4]].tokens, runs[seqs[4]].logprobs) == (alone.tokens, alone.logprobs)
    assert len(alone.tokens) == len(alone.logprobs) == 24


@cpu_only
@pytest.mark.parametrize("chunk", [256, 64])
@pytest.mark.parametrize("kind", ["f32", "q4_k_m"])
def test_long_prompts_and_contexts_alone_and_among_others(small_model: Path, quantized, kind: str,
                                                           chunk: int) -> None:
    """Prompts of 64 tokens or more are prefilled with ggml's tiled flash
    attention, in steps of their own and chunks of 64 rows or more (with
    256-token chunks the 400-token prompt is cut 256 + 144, with 64-token
    chunks 128 + 128 + 80 + 64); decoding, with two threads, runs on the
    per-row kernel even where a lone sequence's query meets 512 cells or
    more (its answer goes from 400 to 540), which would otherwise split them
    among the threads. Beside it: prompts of 5 to 200 tokens."""
    model = small_model if kind == "f32" else quantized(kind)
    prompt = random_prompt(80, 400)
    with _engine(model, n_parallel=5, n_ctx=1024, n_threads=2, prefill_chunk=chunk) as engine:
        alone = generate(engine, prompt, max_tokens=140, logprobs=True, **SAMPLED)
        seqs = [engine.submit(random_prompt(81 + i, n), max_tokens=100, **SAMPLED)
                for i, n in enumerate([5, 70, 130, 200])]
        seqs.insert(2, engine.submit(prompt, max_tokens=140, logprobs=True, **SAMPLED))
        runs = drain(engine, seqs)
    assert alone.finish == "length"
    assert (runs[seqs[2]].tokens, runs[seqs[2]].logprobs) == (alone.tokens, alone.logprobs)


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory: pytest.TempPathFactory, small_shape: dict) -> dict[str, Path]:
    """The small shape as a mixture of 4 experts (2 per token), in f16 and q4_k_m."""
    folder = tmp_path_factory.mktemp("moe")
    shape = {**small_shape, "n_layer": 2, "n_expert": 4, "n_expert_used": 2}
    made = {"f16": write_demo_model(folder / "moe.gguf", **shape)}
    quantize(made["f16"], folder / "moe-q4_k_m.gguf", "q4_k_m")
    made["q4_k_m"] = folder / "moe-q4_k_m.gguf"
    return made


@cpu_only
@pytest.mark.parametrize("kind", ["f16", "q4_k_m"])
def test_a_moe_sequence_alone_and_among_others(moe_models: dict[str, Path], kind: str) -> None:
    """How many rows each expert gets depends on every row of the batch, and
    ggml's tiled K-quant matmul takes an expert's rows from 8 on: on a mixture
    of experts with K-quant weights no prompt is prefilled tiled, and every
    row takes the reference kernels. With float experts (one row at a time
    however many come) the 100-token prompt takes the tiled attention."""
    prompts = [random_prompt(90 + i, n) for i, n in enumerate([5, 12, 40, 100])]
    with _engine(moe_models[kind], n_parallel=4, prefix_cache=False) as engine:
        assert engine.info["reference_kernels"] is (kind == "q4_k_m")
        alone = [generate(engine, p, max_tokens=16, logprobs=True, **SAMPLED) for p in prompts]
        seqs = [engine.submit(p, max_tokens=16, logprobs=True, **SAMPLED) for p in prompts]
        runs = drain(engine, seqs)
    assert [(runs[s].tokens, runs[s].logprobs) for s in seqs] == [(a.tokens, a.logprobs) for a in alone]


def kv_rows(state: bytes) -> dict[int, bytes]:
    """A sequence's KV state (llama_state_seq_get_data of the pinned
    llama.cpp: a magic number and the sequence id, then per stream its cells'
    positions, each layer's K rows and, untransposed, each layer's V rows) as
    {position: that cell's K and V bytes in every layer}."""
    at = 0

    def take(fmt: str):
        nonlocal at
        values = struct.unpack_from("<" + fmt, state, at)
        at += struct.calcsize("<" + fmt)
        return values

    rows: dict[int, bytes] = {}
    magic, _ = take("Ii")
    assert magic == 0xAF143CD8
    (n_stream,) = take("I")
    for _ in range(n_stream):
        (n_cells,) = take("I")
        if n_cells == 0:
            continue
        positions = []
        for _ in range(n_cells):
            pos, n_seq = take("iI")
            take(f"{n_seq}i")
            positions.append(pos)
        v_trans, n_layer = take("II")
        assert v_trans == 0  # flash attention keeps V by rows
        parts: list[list[bytes]] = [[] for _ in positions]
        for _ in range(2 * n_layer):  # K of every layer, then V of every layer
            _, row = take("iQ")
            for i in range(n_cells):
                parts[i].append(state[at + i * row: at + (i + 1) * row])
            at += n_cells * row
        rows.update({pos: b"".join(p) for pos, p in zip(positions, parts)})
    assert at == len(state)
    return rows


def kv_after(engine: Engine, prompt: list[int], tokens: int, neighbours: list[list[int]] = ()) -> dict[int, bytes]:
    """The KV rows of a greedy sequence on ``prompt`` once it has made ``tokens``
    tokens or more, beside ``neighbours`` (long-running sequences)."""
    others = [engine.submit(p, max_tokens=400, temperature=0) for p in neighbours]
    seq = engine.submit(prompt, max_tokens=400, temperature=0)
    made = 0
    while made < tokens:
        engine.wait(60)
        made += sum(len(r["tokens"]) for r in engine.poll() if r["seq"] == seq)
    state = engine.snapshot(seq, with_kv=True)["kv_state"]
    for s in [seq, *others]:
        engine.cancel(s)
    drain(engine, [seq, *others])
    return kv_rows(state)


@cpu_only
@pytest.mark.parametrize("chunk", [256, 16])
def test_a_kquant_sequences_kv_is_the_same_alone_and_among_others(kquant_model: Path, chunk: int) -> None:
    """Row by row, bit for bit: the prompt's KV (prefilled tiled) and the
    generated tokens' (decoded the one-row way), alone and beside prompts of
    5 to 145 tokens that prefill and decode with it."""
    prompt = random_prompt(0, 37)
    neighbours = [random_prompt(10 + i, 5 + 20 * i) for i in range(8)]
    with _engine(kquant_model, n_parallel=9, n_ctx=512, prefill_chunk=chunk) as engine:
        alone = kv_after(engine, prompt, 40)
        beside = kv_after(engine, prompt, 40, neighbours)  # the later steps decode nine rows
    common = sorted(set(alone) & set(beside))
    assert common[:len(prompt) + 39] == list(range(len(prompt) + 39))
    assert [p for p in common if alone[p] != beside[p]] == []


@cpu_only
@pytest.mark.parametrize("kind", ["q6_k", "iq4_xs"])  # where the two kernels differ in every layer
def test_prompts_of_other_lengths_in_one_step_give_what_each_gives_alone(quantized, kind: str) -> None:
    """llama.cpp cuts a batch of several sequences (one KV stream each) into
    ubatches that take as many tokens from each: a 20-token prompt beside a
    16-token one would leave its last 4 rows to a ubatch of their own, too
    few for the tiled kernel."""
    prompts = [random_prompt(70, 20), random_prompt(71, 16), random_prompt(72, 29), random_prompt(73, 8)]
    with _engine(quantized(kind), n_parallel=5, prefix_cache=False) as engine:  # every prompt prefilled whole
        alone = [generate(engine, p, max_tokens=4, temperature=0, logprobs=True).logprobs for p in prompts]
        # a sequence decoding meanwhile, so that the four arrive during a step and are
        # admitted together
        busy = engine.submit(random_prompt(74, 5), max_tokens=60, temperature=0)
        take(engine, 1)  # busy: its first result is out
        seqs = [engine.submit(p, max_tokens=4, temperature=0, logprobs=True) for p in prompts]
        runs = drain(engine, [*seqs, busy])
    assert [runs[s].logprobs for s in seqs] == alone


@cpu_only
def test_nine_prompts_ending_together_give_what_each_gives_alone(kquant_model: Path) -> None:
    """A tiled step ends at most 7 prompts: the last layer and the output
    matmul see only the rows whose logits are wanted, and 8 of them would
    take the tiled kernel there."""
    prompts = [random_prompt(30 + i, 10) for i in range(9)]
    with _engine(kquant_model, n_parallel=9) as engine:
        alone = [generate(engine, p, max_tokens=6, temperature=0, logprobs=True).logprobs for p in prompts]
        seqs = [engine.submit(p, max_tokens=6, temperature=0, logprobs=True) for p in prompts]
        runs = drain(engine, seqs)
    assert [runs[s].logprobs for s in seqs] == alone


@cpu_only
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("n_prompt", [5, 40])
def test_a_kquant_resume_without_kv_continues_the_same_output(kquant_model: Path, case: str, n_prompt: int) -> None:
    """Resumed without its KV state, a sequence prefills its prompt as the
    first run did (tiled from 8 tokens on) and its generated tokens the one-row
    way, as they were decoded."""
    params = CASES[case]
    prompt = random_prompt(50, n_prompt)
    with _engine(kquant_model, n_parallel=2) as first:
        full = generate(first, prompt, max_tokens=30, logprobs=True, **params)
    assert full.finish == "length"
    # a snapshot after the results that carried the first 10 tokens or more
    generated, emitted = [], ""
    for result in full.results:
        if len(generated) >= 10:
            break
        generated += result["tokens"]
        emitted += result["text"]
    with _engine(kquant_model, n_parallel=2) as second:
        other = second.submit(random_prompt(51, 20), max_tokens=20, **params)
        seq = second.submit(prompt, max_tokens=30, resume={"generated": generated, "emitted": emitted},
                            logprobs=True, **params)
        runs = drain(second, [other, seq])
    assert generated + runs[seq].tokens == full.tokens
    assert emitted + runs[seq].text == full.text
    assert runs[seq].logprobs == full.logprobs[len(generated):]


@cpu_only
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("kind", "n_first", "n_more", "tile"),
                         [("q4_k_m", 20, 15, 8), ("q4_k_m", 80, 60, 64), ("f32", 80, 60, 64)])
def test_the_prefix_cache_gives_what_a_full_prefill_gives(small_model: Path, quantized, case: str, kind: str,
                                                          n_first: int, n_more: int, tile: int) -> None:
    """A slot's KV is taken over only where it was computed the way a prefill
    of the new prompt computes it: the earlier prompt's tiled rows, never its
    answer's one-row ones, and only rows tiled for the same kind of step
    (on K-quant weights, prompts under 64 tokens in chunks of 8 or more;
    prompts of 64 or more in chunks of 64 or more), leaving a whole chunk of
    that kind to prefill."""
    params = CASES[case]
    model = small_model if kind == "f32" else quantized(kind)
    with _engine(model, n_parallel=2) as cached, \
            _engine(model, n_parallel=2, prefix_cache=False) as plain:
        first_prompt = random_prompt(60, n_first)
        def both(engine, prompt):
            run = generate(engine, prompt, max_tokens=12, logprobs=True, **params)
            return run, (run.tokens, run.logprobs)

        first, _ = both(cached, first_prompt)
        follow_up = first_prompt + first.tokens + random_prompt(61, n_more)
        assert (len(follow_up) >= 64) is (tile == 64)
        second, got = both(cached, follow_up)
        assert second.last["n_cached"] == len(first_prompt)
        assert got == both(plain, follow_up)[1]
        again, got_again = both(cached, follow_up)  # asked again: its kept logits
        assert again.last["n_cached"] == len(follow_up)
        assert got_again == got
        short = random_prompt(62, 6)  # prefilled the one-row way, as decoding is
        once = both(cached, short)[1]
        twice, got_twice = both(cached, short)
        assert twice.last["n_cached"] == len(short)
        assert once == got_twice == both(plain, short)[1]


@cpu_only
def test_a_prefix_tiled_for_the_other_kind_of_step_is_not_taken_over(kquant_model: Path) -> None:
    """A 40-token prompt is prefilled in chunks of 8 rows or more (per-row flash
    attention), a 100-token one in chunks of 64 or more (tiled flash attention):
    the second cannot build on the first's rows, however many tokens they share."""
    with _engine(kquant_model, n_parallel=1) as cached, \
            _engine(kquant_model, n_parallel=1, prefix_cache=False) as plain:
        shorter = random_prompt(63, 40)
        generate(cached, shorter, max_tokens=4, temperature=0)
        longer = shorter + random_prompt(64, 60)
        run = generate(cached, longer, max_tokens=12, logprobs=True, temperature=0)
        assert run.last["n_cached"] == 0
        fresh = generate(plain, longer, max_tokens=12, logprobs=True, temperature=0)
        assert (run.tokens, run.logprobs) == (fresh.tokens, fresh.logprobs)
