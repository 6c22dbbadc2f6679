"""Engine.embed: pooled, normalized embeddings from a context of their own,
many inputs to a pass, each the same as alone; the engine generates beside it."""
from __future__ import annotations

import numpy as np
import pytest

from lmsp.native import ContextLengthError, Engine, EngineClosedError


def test_vectors_are_normalized_one_per_input(engine: Engine):
    inputs = [engine.tokenize(text, True, False) for text in ("hello world", "a longer input, of more tokens")]
    vectors = engine.embed(inputs)
    assert vectors.shape == (2, engine.info["n_embd"])
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(vectors[0], vectors[1])


def test_a_batch_gives_each_input_what_it_gets_alone(engine: Engine):
    # short (one-row kernels), medium and long inputs (tiled ones) in one call
    inputs = [engine.tokenize(f"input number {i} " * (i * i + 1), True, False)[: 2 + i * 30] for i in range(6)]
    together = engine.embed(inputs)
    for i, tokens in enumerate(inputs):
        alone = engine.embed([tokens])[0]
        assert float(alone @ together[i]) > 0.999999


def test_more_inputs_than_one_pass_holds(engine: Engine):
    inputs = [[1 + i % 50] * 100 for i in range(12)]  # 1200 tokens: three passes of a 512-token context
    vectors = engine.embed(inputs)
    assert vectors.shape[0] == 12
    assert float(vectors[0] @ engine.embed([inputs[0]])[0]) > 0.9999


def test_bad_inputs_are_refused(engine: Engine):
    with pytest.raises(ContextLengthError):
        engine.embed([[1] * 513])
    with pytest.raises(ValueError):
        engine.embed([[]])
    with pytest.raises(ValueError):
        engine.embed([[engine.n_vocab]])
    assert engine.embed([]).shape[0] == 0


def test_passes_hold_512_rows_and_leave_out_the_output_layer(make_engine):
    e = make_engine()
    inputs = [[1 + (i + k) % 50 for k in range(64)] for i in range(16)]  # 1024 rows
    e.embed(inputs)
    counts = e.stats()
    assert counts["embed_passes"] == 2
    # on the CPU alone, no pass computes the logits (llama.cpp's output layer)
    assert counts["embed_passes_without_logits"] == 2


def test_the_engine_generates_beside_embeddings(make_engine):
    e = make_engine(n_parallel=2)
    seq = e.submit(e.tokenize("once upon a time", True, False), max_tokens=8, temperature=0)
    e.embed([e.tokenize("in between", True, False)])
    done = []
    while not done:
        e.wait(5.0)
        done = [r for r in e.poll() if r["seq"] == seq and r["finish"]]
    assert done[0]["finish"] == "length"
    e.close()
    with pytest.raises(EngineClosedError):
        e.embed([[1]])


def test_fim_tokens_are_listed(engine: Engine):
    assert engine.info["fim_tokens"] == []  # the demo model has none


def test_a_long_input_passes_alone_and_the_next_call_gives_the_same_vectors(make_engine):
    engine = make_engine(n_ctx=1024, n_parallel=1)
    short = [engine.tokenize("a short input", True, False)]
    before = engine.embed(short)
    long = [[1 + i % 50 for i in range(600)]]  # longer than a usual pass: its buffers are freed after it
    assert engine.embed(long + short).shape[0] == 2
    assert float(engine.embed(short)[0] @ before[0]) > 0.999999
    assert engine.stats()["embed_passes"] == 4
