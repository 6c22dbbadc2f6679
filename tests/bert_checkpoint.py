"""A small sentence-transformers BERT checkpoint with seeded random weights, for tests.

The layout is the one the catalog's embedding model comes in (``config.json``,
``model.safetensors``, ``tokenizer.json`` with a WordPiece model,
``modules.json``, ``1_Pooling/config.json``), at a size that converts and runs
in well under a second. The safetensors file is written here, from the format's
description (an 8-byte header length, a JSON header, raw arrays).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the quick brown fox jump over lazy dog hello world a an is it to of and in on at sea river "
    "run walk book read cat play un caf naive costs ok yes no . , ! ? ' - $ ( ) : ; 0 1 2 3 4 5 6 7 8 9"
).split()
PIECES = ["##s", "##ed", "##ing", "##er", "##ly", "##e", "##y"] + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
# the Hangul syllable \ud55c decomposed (NFD): BERT's tokenizer matches its jamo
PIECES += ["\u1112", "##\u1161", "##\u11ab"]
VOCAB = list(dict.fromkeys(SPECIAL + WORDS + list("abcdefghijklmnopqrstuvwxyz") + PIECES))


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtypes: dict[str, str] | None = None) -> None:
    """``tensors`` as a safetensors file; ``dtypes`` names the format's dtype of raw arrays (BF16)."""
    kinds = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i8"): "I64"}
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        blob = np.ascontiguousarray(array).tobytes()
        kind = (dtypes or {}).get(name) or kinds[array.dtype]
        header[name] = {"dtype": kind, "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def bert_tensors(n_vocab: int, n_embd: int, n_layer: int, n_ff: int, n_ctx: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def rand(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out = {
        "embeddings.position_ids": np.arange(n_ctx, dtype=np.int64)[None, :],
        "embeddings.word_embeddings.weight": rand(n_vocab, n_embd, scale=1.0),
        "embeddings.position_embeddings.weight": rand(n_ctx, n_embd),
        "embeddings.token_type_embeddings.weight": rand(2, n_embd),
        "embeddings.LayerNorm.weight": 1 + rand(n_embd, scale=0.1),
        "embeddings.LayerNorm.bias": rand(n_embd, scale=0.1),
    }
    for i in range(n_layer):
        p = f"encoder.layer.{i}."
        for part, rows, cols in (
            ("attention.self.query", n_embd, n_embd),
            ("attention.self.key", n_embd, n_embd),
            ("attention.self.value", n_embd, n_embd),
            ("attention.output.dense", n_embd, n_embd),
            ("intermediate.dense", n_ff, n_embd),
            ("output.dense", n_embd, n_ff),
        ):
            out[p + part + ".weight"] = rand(rows, cols, scale=cols**-0.5)
            out[p + part + ".bias"] = rand(rows, scale=0.05)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            out[p + norm + ".weight"] = 1 + rand(n_embd, scale=0.1)
            out[p + norm + ".bias"] = rand(n_embd, scale=0.1)
    out["pooler.dense.weight"] = rand(n_embd, n_embd)
    out["pooler.dense.bias"] = rand(n_embd)
    return out


def tokenizer_json(vocab: list[str]) -> dict:
    ids = {tok: i for i, tok in enumerate(vocab)}
    added = [
        {"id": ids[t], "content": t, "special": True, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False}
        for t in SPECIAL
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [],
            "special_tokens": {},
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": ids},
    }


def write_checkpoint(
    folder: Path,
    *,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_ff: int = 128,
    n_ctx: int = 64,
    seed: int = 0,
    pooling: str = "pooling_mode_mean_tokens",
) -> Path:
    """A sentence-transformers BERT checkpoint in ``folder`` (made if need be); returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu", "hidden_size": n_embd,
        "intermediate_size": n_ff, "layer_norm_eps": 1e-12, "max_position_embeddings": n_ctx,
        "num_attention_heads": n_head, "num_hidden_layers": n_layer, "pad_token_id": 0,
        "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": len(VOCAB),
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(VOCAB)))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    modes = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens")
    pool = {"word_embedding_dimension": n_embd, **{m: m == pooling for m in modes}}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pool))
    write_safetensors(folder / "model.safetensors", bert_tensors(len(VOCAB), n_embd, n_layer, n_ff, n_ctx, seed))
    return folder
