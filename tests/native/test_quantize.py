"""lmsp.native.quantize, and batch invariance on the models it makes.

K-quant weights (q4_k_m and its kin, the most common downloads) are where
ggml's CPU backend has a tiled matmul for 8 or more rows, summing in another
order than the one-row path: without the engine's reference kernels a
sequence's logits would depend on how many rows were computed with it.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from native_helpers import N_GPU_LAYERS, drain, generate

from lmsp.demo_model import write_demo_model
from lmsp.native import QUANTIZE_TYPES, Engine, ModelFormatError, NativeError, quantize, read_gguf_info, system_info


def random_prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 30000) for _ in range(n)]


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model's "small" shape (rows of 256 and 768: whole K-quant
    blocks) in two layers."""
    return write_demo_model(tmp_path_factory.mktemp("quantized") / "small.gguf", preset="small", n_layer=2)


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


@cpu_only
def test_without_invariance_a_kquant_models_rows_differ(kquant_model: Path) -> None:
    """What the test above guards against: on a CPU with ggml's tiled or
    repacked K-quant paths (x86 with AVX2), batch_invariant=False gives rows
    that depend on the batch."""
    if "AVX2 = 1" not in system_info():
        pytest.skip("ggml has no tiled K-quant matmul for this CPU")
    tokens = random_prompt(4, 80)
    with _engine(kquant_model, n_parallel=1, batch_invariant=False) as fast:
        assert fast.info["reference_kernels"] is False
        whole = fast.eval_logits(tokens)
        assert not all(np.array_equal(fast.eval_logits(tokens[:n]), whole[:n]) for n in (1, 7))


@cpu_only
@pytest.mark.parametrize("params", [dict(temperature=0), dict(seed=5, temperature=0.9, top_k=40)],
                         ids=["greedy", "sampled"])
def test_a_kquant_sequence_alone_and_among_eight_others(kquant_model: Path, params: dict) -> None:
    prompt = random_prompt(0, 30)
    with _engine(kquant_model, n_parallel=9) as engine:
        alone = generate(engine, prompt, max_tokens=24, **params)
        # nine rows per decoding step, and neighbours still prefilling among them
        seqs = [engine.submit(random_prompt(10 + i, 5 + 20 * i), max_tokens=24, **params) for i in range(8)]
        seqs.insert(4, engine.submit(prompt, max_tokens=24, **params))
        runs = drain(engine, seqs)
    assert runs[seqs[4]].tokens == alone.tokens
    assert len(alone.tokens) == 24
