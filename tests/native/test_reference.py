"""The engine's forward pass against a plain numpy llama.

The reference reads the demo model's weights with ``gguf.GGUFReader`` and
computes, in float64, what llama.cpp computes for LLM_ARCH_LLAMA:

    x = token_embd[tokens]
    per layer:
        h = rmsnorm(x) * attn_norm
        q, k, v = h Wq^T, h Wk^T, h Wv^T          split into heads of head_dim
        q, k = rope(q), rope(k)                    "normal" rope: consecutive pairs
        a = softmax(q k^T / sqrt(head_dim) + causal mask) v     (GQA: query head
            i reads kv head i // (n_head / n_head_kv))
        x = x + a Wo^T
        h = rmsnorm(x) * ffn_norm
        x = x + (silu(h Wgate^T) * (h Wup^T)) Wdown^T
    logits = (rmsnorm(x) * output_norm) Woutput^T

Tolerance, and why: with f32 weights, an f32 KV cache and no flash attention
llama.cpp agrees with this reference to about 1e-6 of the logits' spread (f32
rounding). On the CPU it keeps K in an f16 cache (2^-11 relative rounding)
and V in a bf16 one (2^-8, see csrc/batch_plan.cpp), which shows in the logits as
up to 7.1e-3 of their standard deviation with f32 weights and 8.0e-3 with f16
weights (measured on the tiny model; 2.7e-3 and 4.3e-3 with V in f16, as
with ``batch_invariant=False``).
So for f32 and f16 weights we require, at every position,

    max |engine - reference| <= 1e-2 * max(1, std(reference logits))

which leaves a margin of 1.25 or more, while a wrong rope convention (NEOX
halves instead of pairs, or no rope), a wrong grouping of GQA heads or a
missing causal mask each give 1.8 to 4.8 on the same scale. q8_0 weights make
llama.cpp quantize the activations to 8 bits as well (6.5e-2 to 8.2e-2
measured), so they get 0.25, still far below those errors. The top token must
agree wherever the reference's best two logits are further apart than the
tolerance.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from lmsp.models.demo import write_demo_model
from lmsp.native import Engine

RELATIVE_TOLERANCE = 1e-2


class Reference:
    """A float64 numpy forward pass of a llama GGUF (f32, f16 or q8_0 weights)."""

    def __init__(self, path: Path) -> None:
        reader = gguf.GGUFReader(path)

        def meta(key: str):
            return reader.fields[key].contents()

        self.n_layer = meta("llama.block_count")
        self.n_head = meta("llama.attention.head_count")
        self.n_head_kv = meta("llama.attention.head_count_kv")
        self.n_embd = meta("llama.embedding_length")
        self.eps = meta("llama.attention.layer_norm_rms_epsilon")
        self.freq_base = meta("llama.rope.freq_base")
        self.head_dim = self.n_embd // self.n_head
        self.w: dict[str, np.ndarray] = {}
        for t in reader.tensors:
            rows = tuple(int(d) for d in reversed(t.shape.tolist()))  # numpy order
            values = gguf.quants.dequantize(np.array(t.data), t.tensor_type)
            self.w[t.name] = values.reshape(rows).astype(np.float64)

    def _rmsnorm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        # x: [n_tokens, heads, head_dim]; pairs (0,1), (2,3), ... rotate by
        # pos * base^(-2i/head_dim)
        half = self.head_dim // 2
        theta = self.freq_base ** (-2.0 * np.arange(half) / self.head_dim)
        angle = positions[:, None] * theta[None, :]            # [n, half]
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def logits(self, tokens: list[int]) -> np.ndarray:
        n, hd = len(tokens), self.head_dim
        positions = np.arange(n, dtype=np.float64)
        mask = np.triu(np.full((n, n), -np.inf), k=1)
        group = self.n_head // self.n_head_kv
        x = self.w["token_embd.weight"][tokens]
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self._rmsnorm(x, self.w[p + "attn_norm.weight"])
            q = (h @ self.w[p + "attn_q.weight"].T).reshape(n, self.n_head, hd)
            k = (h @ self.w[p + "attn_k.weight"].T).reshape(n, self.n_head_kv, hd)
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(n, self.n_head_kv, hd)
            q, k = self._rope(q, positions), self._rope(k, positions)
            heads = []
            for head in range(self.n_head):
                kv = head // group
                scores = q[:, head] @ k[:, kv].T / np.sqrt(hd) + mask
                scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
                heads.append((scores / scores.sum(axis=-1, keepdims=True)) @ v[:, kv])
            x = x + np.concatenate(heads, axis=-1) @ self.w[p + "attn_output.weight"].T
            h = self._rmsnorm(x, self.w[p + "ffn_norm.weight"])
            gate = h @ self.w[p + "ffn_gate.weight"].T
            up = h @ self.w[p + "ffn_up.weight"].T
            x = x + (gate / (1.0 + np.exp(-gate)) * up) @ self.w[p + "ffn_down.weight"].T
        x = self._rmsnorm(x, self.w["output_norm.weight"])
        return x @ self.w["output.weight"].T


# token ids of the SPM vocabulary: BOS, then ordinary pieces across the whole
# range (byte tokens 3..258 included), long enough for rope to turn far
TOKENS = [1] + np.random.default_rng(7).integers(3, 32000, size=47).tolist()
# 64 rows or more: with batch_invariant=False the CPU's flash attention takes
# its tiled kernel for them
LONG_TOKENS = [1] + np.random.default_rng(8).integers(3, 32000, size=95).tolist()


@pytest.fixture(scope="module")
def models(demo_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("reference")
    return {
        "f32": demo_model_path,
        "f16": write_demo_model(folder / "f16.gguf", dtype="f16"),
        "q8_0": write_demo_model(folder / "q8_0.gguf", dtype="q8_0"),
    }


@pytest.fixture(scope="module")
def references(models: dict[str, Path]) -> dict[str, Reference]:
    # reading a model's 32000-token vocabulary takes about a second: once each
    return {dtype: Reference(path) for dtype, path in models.items()}


def test_reference_is_causal(references: dict[str, Reference]) -> None:
    ref = references["f32"]
    full = ref.logits(TOKENS[:12])
    prefix = ref.logits(TOKENS[:5])
    np.testing.assert_allclose(full[:5], prefix, rtol=0, atol=1e-9)
    assert np.abs(full[5:] - ref.logits(TOKENS[:4] + TOKENS[5:12])[4:]).max() > 1e-3


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fast"])
@pytest.mark.parametrize(("dtype", "tolerance"), [("f32", 1e-2), ("f16", 1e-2), ("q8_0", 0.25)])
def test_engine_logits_match_the_reference(models: dict[str, Path], references: dict[str, Reference],
                                           dtype: str, tolerance: float, invariant: bool) -> None:
    path = models[dtype]
    tokens = TOKENS if invariant else LONG_TOKENS
    want = references[dtype].logits(tokens)
    engine = Engine(str(path), batch_invariant=invariant)
    try:
        assert engine.info["batch_invariant"] is (invariant and engine.info["backend"] == "cpu")
        got = np.asarray(engine.eval_logits(tokens))
    finally:
        engine.close()
    assert got.dtype == np.float32
    assert got.shape == want.shape == (len(tokens), 32000)
    scale = np.maximum(1.0, want.std(axis=1))
    error = np.abs(got - want).max(axis=1) / scale
    assert error.max() <= tolerance, f"worst position {error.argmax()}: {error.max():.3g} of the logit scale"
    top2 = np.sort(want, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > tolerance * scale
    assert clear.sum() >= len(tokens) // 4  # the check below is not empty
    np.testing.assert_array_equal(got.argmax(axis=1)[clear], want.argmax(axis=1)[clear])
