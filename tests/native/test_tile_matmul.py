"""The tiled matrix products (csrc/tile_matmul.cpp): ggml's one-row numbers,
bit for bit, for every element, whatever the number of rows, with the
kernels of whichever instruction set the build targets (AVX-512 VNNI, AVX2
with or without AVX-VNNI), and for f16 weights too.

Where the build has no tiles (a CPU without AVX2), nothing claims a product:
the tests check that instead."""
from __future__ import annotations

import platform
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from native_helpers import N_GPU_LAYERS, drain

from lmsp import _native
from lmsp.models.demo import write_demo_model
from lmsp.native import Engine

pytestmark = pytest.mark.skipif(N_GPU_LAYERS != 0, reason="the tiles are the CPU backend's")

TYPES = ["q4_1", "q5_0", "q8_0", "q4_K", "q6_K", "f16"]
# (weight rows, activation rows, values per row): every tile shape (1-4
# activation rows and their remainders), activation rows past one chunk of
# 64, and the catalog models' row lengths (the K-quants' in superblocks of 256)
SHAPES = [(4, 1, 32), (8, 2, 64), (8, 3, 576), (12, 4, 576), (8, 5, 1536), (16, 7, 1536), (4, 9, 2048),
          (8, 64, 576), (8, 67, 576), (4, 130, 1536)]
K_SHAPES = [(4, 1, 256), (8, 2, 512), (8, 3, 1024), (12, 4, 256), (8, 5, 2048), (16, 7, 1024), (4, 9, 2048),
            (8, 64, 1024), (8, 67, 256), (4, 130, 1024)]
# f16 rows are a whole number of vec_dot's steps (64 values with AVX-512):
# the embedding model's 384 and 1536 among them
F16_SHAPES = [(4, 1, 64), (8, 2, 128), (8, 3, 384), (12, 4, 384), (8, 5, 1536), (16, 7, 1536), (4, 9, 2048),
              (8, 64, 384), (8, 67, 384), (4, 130, 1536)]


@pytest.fixture
def tiles_on() -> Iterator[None]:
    yield
    _native.set_tile_matmul(True)


@pytest.mark.parametrize("type_", TYPES)
def test_tiled_products_equal_ggmls_one_row_dot_product_bit_for_bit(type_: str) -> None:
    shapes = K_SHAPES if type_.endswith("_K") else F16_SHAPES if type_ == "f16" else SHAPES
    for seed, (rows, n, k) in enumerate(shapes):
        assert _native.tile_matmul_matches(type_, rows, n, k, seed) is _native.TILE_MATMUL_BUILT, (rows, n, k)


def test_a_shape_the_tiles_cannot_take_is_refused() -> None:
    # a row length that is not a whole number of blocks (of f16 steps), a
    # weight row count that is not a whole number of tiles, an unknown type
    assert not _native.tile_matmul_matches("q4_K", 8, 2, 288, 1)
    assert not _native.tile_matmul_matches("f16", 8, 2, 48, 1)
    assert not _native.tile_matmul_matches("q8_0", 6, 2, 64, 1)
    assert not _native.tile_matmul_matches("bf16", 8, 2, 64, 1)


def test_the_k_quants_activations_are_quantized_to_ggmls_bytes(engine: Engine) -> None:
    # tile_quantize.cpp's q8_K (blocks of random values at scales 2^-12 to 2^11,
    # zeros, the largest magnitude twice with either sign first, halves that
    # round to even, a NaN) is ggml's own, byte for byte, the bytes it leaves
    # as they were included; the hook quantizes with it once the same check
    # passed at install (the engine fixture installed it). x86 builds only.
    built = _native.TILE_MATMUL_BUILT and platform.machine().lower() in ("x86_64", "amd64")
    for seed, k in enumerate([256, 512, 1024, 1536, 2048, 6144] * 10):
        assert _native.tile_quantize_matches(k, seed) is built, (k, seed)
    assert not _native.tile_quantize_matches(300, 1)
    assert _native.tile_quantize_q8_K() is built


def _run(engine: Engine, prompts: list[list[int]]) -> tuple[np.ndarray, list[list[int]]]:
    """The logits of the first prompt's every position, and what four sequences
    decode side by side (sampled, so that every logit matters)."""
    logits = engine.eval_logits(prompts[0])
    seqs = [engine.submit(p, max_tokens=24, temperature=0.9, top_k=40, seed=5 + i) for i, p in enumerate(prompts)]
    runs = drain(engine, seqs)
    return logits, [runs[s].tokens for s in seqs]


def _same_with_and_without(model: Path, prompts: list[list[int]], kquants: bool = False) -> None:
    """With `kquants` (the model has q4_K and q6_K weights), where ggml's tiled
    K-quant matmul keeps the prompts' products (x86 with AVX-512 VNNI), it takes
    their activations from tile_quantize.cpp with the tiles on."""
    handed_over = kquants and _native.tile_quantize_q8_K() and not _native.TILE_MATMUL_KQUANTS_FIRST
    engine = Engine(str(model), n_ctx=1024, n_parallel=4, n_threads=2)
    try:
        assert engine.info["tile_matmul"] == (TYPES if _native.TILE_MATMUL_BUILT else [])
        before = _native.tile_matmul_products(), _native.tile_quantize_ggml_tiled_products()
        tiled = _run(engine, prompts)
        assert (_native.tile_matmul_products() > before[0]) is _native.TILE_MATMUL_BUILT
        assert (_native.tile_quantize_ggml_tiled_products() > before[1]) is handed_over
        _native.set_tile_matmul(False)
        assert engine.info["tile_matmul"] == []
        before = _native.tile_matmul_products(), _native.tile_quantize_ggml_tiled_products()
        plain = _run(engine, prompts)
        assert (_native.tile_matmul_products(), _native.tile_quantize_ggml_tiled_products()) == before
    finally:
        engine.close()
    assert tiled[0].tobytes() == plain[0].tobytes()
    assert tiled[1] == plain[1]


def test_an_engine_on_q8_0_weights_computes_the_same_bits_with_and_without_tiles(
        tmp_path: Path, tiles_on: None) -> None:
    model = write_demo_model(tmp_path / "tiny-q8_0.gguf", dtype="q8_0")
    prompts = [[1] + [(i * 131 + j * 17) % 31000 + 200 for j in range(n)] for i, n in enumerate((80, 5, 70, 12))]
    _same_with_and_without(model, prompts)


@pytest.mark.real_model
@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma-3-270m"])
def test_a_catalog_model_computes_the_same_bits_with_and_without_tiles(catalog_model, name: str,
                                                                       tiles_on: None) -> None:
    # SmolLM2: q4_1 and q8_0 weights; Gemma 3: q5_0 and q8_0 beside K-quants
    # (ggml's reference kernels in one-row steps, its tiled ones for prompts)
    model = catalog_model(name)
    prompts = [[2] + [(i * 37 + j * 11) % 40000 + 100 for j in range(n)] for i, n in enumerate((69, 7, 90, 20))]
    _same_with_and_without(model, prompts, kquants=name == "gemma-3-270m")


def test_an_engine_on_f16_weights_computes_the_same_bits_with_and_without_tiles(
        tmp_path: Path, tiles_on: None) -> None:
    model = write_demo_model(tmp_path / "tiny-f16.gguf", dtype="f16")
    prompts = [[1] + [(i * 131 + j * 17) % 31000 + 200 for j in range(n)] for i, n in enumerate((80, 5, 70, 12))]
    _same_with_and_without(model, prompts)


@pytest.mark.real_model
def test_the_embedding_models_vectors_are_the_same_bits_with_and_without_tiles(catalog_model,
                                                                               tiles_on: None) -> None:
    # all-MiniLM-L6-v2: f16 matrices of 384 and 1536 values a row
    engine = Engine(str(catalog_model("all-minilm-l6-v2")), n_ctx=2048, n_parallel=1, n_threads=2)
    inputs = [[101] + [(i * 97 + j * 13) % 20000 + 1000 for j in range(n)] + [102]
              for i, n in enumerate((62, 5, 30, 126, 9))]
    try:
        before = _native.tile_matmul_products()
        tiled = engine.embed(inputs)
        assert (_native.tile_matmul_products() > before) is _native.TILE_MATMUL_BUILT
        _native.set_tile_matmul(False)
        plain = engine.embed(inputs)
    finally:
        engine.close()
    assert tiled.tobytes() == plain.tobytes()
