"""A sentence-transformers BERT checkpoint as a GGUF file that llama.cpp runs as an embedding model.

The checkpoint is a folder in the sentence-transformers layout: ``config.json``
(a BERT encoder), ``model.safetensors``, ``tokenizer.json`` (WordPiece),
``modules.json`` with a ``Pooling`` module (``1_Pooling/config.json``: mean or
CLS pooling) and optionally ``Normalize``. The GGUF file holds what llama.cpp's
``bert`` architecture reads: the encoder's shape, non-causal attention, the
pooling type, the WordPiece vocabulary (word-initial pieces marked with U+2581,
continuation pieces without their ``##``, special tokens as they are), the
special tokens and the tensors under llama.cpp's names. Weight matrices are
written in f16 or q8_0, norms and biases in f32. The same checkpoint and
options always give the same bytes.

    python -m lmsp.models.bert_gguf CHECKPOINT_DIR OUT.gguf [--dtype f16|q8_0] [--name NAME]

A checkpoint this module does not understand is refused with one line
(:class:`ConversionError`); nothing is written then.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmsp.models.gguf_write import gguf_writer
from lmsp.models.safetensors_file import SafetensorsError, read_safetensors

__all__ = ["DTYPES", "BertShape", "ConversionError", "convert", "main"]

DTYPES = ("f16", "q8_0")
_FILE_TYPE = {"f16": 1, "q8_0": 7}  # GGUF general.file_type (llama_ftype)
_POOLING = {"pooling_mode_mean_tokens": 1, "pooling_mode_cls_token": 2}  # llama_pooling_type
_IGNORED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
_CONTROL, _NORMAL = 3, 1  # GGUF token types
# config.json's integers, in BertShape's order
_CONFIG_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)
_WORD_START = "\u2581"
# llama.cpp adds the token-type row to f32 activations, which ggml does in f32 only
_F32_TABLES = ("token_types.",)


class ConversionError(ValueError):
    """A checkpoint that cannot be converted: a one-line reason."""


@dataclass(frozen=True)
class BertShape:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_ff: int
    n_ctx: int
    n_types: int
    norm_eps: float


# ---------------------------------------------------------------------- reading the checkpoint
def _json(folder: Path, name: str) -> Any:
    try:
        with open(folder / name, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise ConversionError(f"the checkpoint has no {name}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConversionError(f"{name} is unreadable: {exc}") from None


def _shape(config: Any) -> BertShape:
    if not isinstance(config, dict) or config.get("model_type") != "bert":
        raise ConversionError("config.json does not describe a BERT model (model_type is not 'bert')")
    if config.get("hidden_act", "gelu") != "gelu":
        raise ConversionError(f"config.json: hidden_act {config.get('hidden_act')!r} is not 'gelu'")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ConversionError("config.json: only absolute position embeddings are supported")
    values = [config.get(k) for k in _CONFIG_KEYS]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise ConversionError(f"config.json needs positive integers {', '.join(_CONFIG_KEYS)}")
    eps = config.get("layer_norm_eps", 1e-12)
    if not isinstance(eps, (int, float)) or not eps > 0:
        raise ConversionError(f"config.json: layer_norm_eps {eps!r} is not a positive number")
    fields = ("n_vocab", "n_embd", "n_layer", "n_head", "n_ff", "n_ctx", "n_types")
    shape = BertShape(**{f: int(v) for f, v in zip(fields, values)}, norm_eps=float(eps))  # type: ignore[arg-type]
    if shape.n_embd % shape.n_head:
        raise ConversionError("config.json: hidden_size is not a multiple of num_attention_heads")
    return shape


def _pooling(folder: Path) -> int:
    """llama.cpp's pooling type of the checkpoint's Pooling module (mean or CLS)."""
    modules = _json(folder, "modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ConversionError("modules.json is not a list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds[:2] != ["Transformer", "Pooling"] or any(k != "Normalize" for k in kinds[2:]):
        raise ConversionError(f"modules.json: the modules {kinds} are not Transformer, Pooling[, Normalize]")
    pooling = _json(folder, str(modules[1].get("path", "")) + "/config.json")
    chosen = [mode for mode in _POOLING if pooling.get(mode)]
    others = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v and k not in _POOLING]
    if len(chosen) != 1 or others:
        raise ConversionError(f"the Pooling module's modes {chosen + others} are not one of mean or CLS")
    return _POOLING[chosen[0]]


@dataclass(frozen=True)
class Vocabulary:
    tokens: list[str]  # as llama.cpp's WordPiece tokenizer looks them up
    types: list[int]
    special: dict[str, int]  # cls, sep, unk, pad, mask: ids
    lowercase: bool
    strip_accents: bool


def _vocabulary(tokenizer: Any, n_vocab: int) -> Vocabulary:
    model = tokenizer.get("model") if isinstance(tokenizer, dict) else None
    if not isinstance(model, dict) or (model.get("type"), model.get("continuing_subword_prefix")) != (
        "WordPiece",
        "##",
    ):
        raise ConversionError("tokenizer.json does not hold a WordPiece model with the '##' prefix")
    normalizer, pre = tokenizer.get("normalizer") or {}, tokenizer.get("pre_tokenizer") or {}
    if normalizer.get("type") != "BertNormalizer" or pre.get("type") != "BertPreTokenizer":
        raise ConversionError("tokenizer.json: the normalizer and pre-tokenizer are not BERT's")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(n_vocab)):
        raise ConversionError(f"tokenizer.json: the vocabulary is not {n_vocab} tokens numbered from 0")
    by_id = sorted(vocab, key=vocab.__getitem__)
    control = {t.get("id") for t in tokenizer.get("added_tokens") or () if isinstance(t, dict) and t.get("special")}
    tokens = [
        tok if i in control else tok[2:] if tok.startswith("##") else _WORD_START + tok for i, tok in enumerate(by_id)
    ]
    unk = vocab.get(model.get("unk_token"))
    if unk is None:
        raise ConversionError("tokenizer.json: the unknown token is not in the vocabulary")
    special = {"unk": int(unk), **_template_tokens(tokenizer.get("post_processor"), vocab)}
    for role, text in (("pad", (tokenizer.get("padding") or {}).get("pad_token", "[PAD]")), ("mask", "[MASK]")):
        if vocab.get(text) in control:
            special[role] = int(vocab[text])
    lowercase = bool(normalizer.get("lowercase", True))
    accents = normalizer.get("strip_accents")
    return Vocabulary(
        tokens=tokens,
        types=[_CONTROL if i in control else _NORMAL for i in range(n_vocab)],
        special=special,
        lowercase=lowercase,
        strip_accents=lowercase if accents is None else bool(accents),
    )


def _template_tokens(post: Any, vocab: dict[str, int]) -> dict[str, int]:
    """The ids of the tokens around a single text: [CLS] text [SEP]."""
    single = post.get("single") if isinstance(post, dict) and post.get("type") == "TemplateProcessing" else None
    pieces = [p.get("SpecialToken", {}).get("id") if "SpecialToken" in p else "A" for p in single or ()]
    if len(pieces) != 3 or pieces[1] != "A" or pieces[0] not in vocab or pieces[2] not in vocab:
        raise ConversionError("tokenizer.json: the post-processor does not put one token on each side of a text")
    return {"cls": vocab[pieces[0]], "sep": vocab[pieces[2]]}


# ---------------------------------------------------------------------- tensors
def _hf_names(shape: BertShape) -> Iterator[tuple[str, str, tuple[int, ...]]]:
    """(checkpoint name, GGUF name, numpy shape) of every tensor, in file order."""
    import gguf

    def gguf_name(kind: gguf.MODEL_TENSOR, suffix: str, bid: int | None = None) -> str:
        return gguf.TENSOR_NAMES[kind].format(bid=bid) + suffix

    t = gguf.MODEL_TENSOR
    e, ff = shape.n_embd, shape.n_ff
    yield "embeddings.word_embeddings.weight", gguf_name(t.TOKEN_EMBD, ".weight"), (shape.n_vocab, e)
    yield "embeddings.token_type_embeddings.weight", gguf_name(t.TOKEN_TYPES, ".weight"), (shape.n_types, e)
    yield "embeddings.position_embeddings.weight", gguf_name(t.POS_EMBD, ".weight"), (shape.n_ctx, e)
    for part in ("weight", "bias"):
        yield f"embeddings.LayerNorm.{part}", gguf_name(t.TOKEN_EMBD_NORM, "." + part), (e,)
    for i in range(shape.n_layer):
        layer = f"encoder.layer.{i}."
        blocks = (
            ("attention.self.query", t.ATTN_Q, (e, e)),
            ("attention.self.key", t.ATTN_K, (e, e)),
            ("attention.self.value", t.ATTN_V, (e, e)),
            ("attention.output.dense", t.ATTN_OUT, (e, e)),
            ("attention.output.LayerNorm", t.ATTN_OUT_NORM, (e,)),
            ("intermediate.dense", t.FFN_UP, (ff, e)),
            ("output.dense", t.FFN_DOWN, (e, ff)),
            ("output.LayerNorm", t.LAYER_OUT_NORM, (e,)),
        )
        for hf, kind, dims in blocks:
            yield layer + hf + ".weight", gguf_name(kind, ".weight", i), dims
            yield layer + hf + ".bias", gguf_name(kind, ".bias", i), dims[:1]


def _tensors(folder: Path, shape: BertShape) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, float32 values) of every tensor, checked against the configuration."""
    try:
        found = read_safetensors(folder / "model.safetensors")
    except FileNotFoundError:
        raise ConversionError("the checkpoint has no model.safetensors") from None
    except (OSError, SafetensorsError) as exc:
        raise ConversionError(f"model.safetensors is unusable: {exc}") from None
    found = {k[5:] if k.startswith("bert.") else k: v for k, v in found.items()}
    out = []
    for hf, name, dims in _hf_names(shape):
        if hf not in found:
            raise ConversionError(f"model.safetensors has no tensor {hf}")
        kind, array = found.pop(hf)
        if kind not in ("F32", "F16", "BF16") or tuple(array.shape) != dims:
            raise ConversionError(f"model.safetensors: {hf} is {kind} {list(array.shape)}, not float {list(dims)}")
        values = (array.astype(np.uint32) << 16).view(np.float32) if kind == "BF16" else array.astype(np.float32)
        out.append((name, values))
    unknown = sorted(set(found) - set(_IGNORED))
    if unknown:
        raise ConversionError(f"model.safetensors has tensors this converter does not know: {', '.join(unknown[:3])}")
    return out


# ---------------------------------------------------------------------- writing
def convert(
    checkpoint: os.PathLike[str] | str, out: os.PathLike[str] | str, *, dtype: str = "f16", name: str | None = None
) -> Path:
    """Write the checkpoint folder as a GGUF file at ``out`` (atomically) and return its path."""
    import gguf

    if dtype not in DTYPES:
        raise ConversionError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    folder, out = Path(checkpoint), Path(out)
    shape = _shape(_json(folder, "config.json"))
    vocab = _vocabulary(_json(folder, "tokenizer.json"), shape.n_vocab)
    pooling = _pooling(folder)
    tensors = _tensors(folder, shape)
    with gguf_writer(out, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT]) as writer:
        _write_keys(writer, shape, vocab, pooling, dtype, name or folder.name)
        for tensor_name, values in tensors:
            _add_tensor(writer, tensor_name, values, dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    return out


def _write_keys(writer: Any, shape: BertShape, vocab: Vocabulary, pooling: int, dtype: str, name: str) -> None:
    import gguf

    writer.add_name(name)
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_block_count(shape.n_layer)
    writer.add_head_count(shape.n_head)
    writer.add_layer_norm_eps(shape.norm_eps)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(pooling))
    writer.add_file_type(_FILE_TYPE[dtype])
    if dtype == "q8_0":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_tokenizer_model("bert")
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_type_count(shape.n_types)
    writer.add_bos_token_id(vocab.special["cls"])  # llama.cpp puts BERT's [CLS] where a BOS goes
    writer.add_sep_token_id(vocab.special["sep"])
    writer.add_unk_token_id(vocab.special["unk"])
    if "pad" in vocab.special:
        writer.add_pad_token_id(vocab.special["pad"])
    if "mask" in vocab.special:
        writer.add_mask_token_id(vocab.special["mask"])
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)
    writer.add_add_eos_token(False)
    writer.add_bool("tokenizer.ggml.normalizer.lowercase", vocab.lowercase)
    writer.add_bool("tokenizer.ggml.normalizer.strip_accents", vocab.strip_accents)


def _add_tensor(writer: Any, name: str, values: np.ndarray, dtype: str) -> None:
    import gguf

    if values.ndim == 1 or name.startswith(_F32_TABLES):
        writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))
    elif dtype == "f16":
        writer.add_tensor(name, values.astype(np.float16))
    else:
        quantized = gguf.quants.quantize(np.ascontiguousarray(values), gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(name, quantized, raw_dtype=gguf.GGMLQuantizationType.Q8_0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lmsp.models.bert_gguf", description="Convert a sentence-transformers BERT checkpoint to GGUF."
    )
    parser.add_argument("checkpoint", type=Path, help="the checkpoint's folder")
    parser.add_argument("out", type=Path, help="the GGUF file to write")
    parser.add_argument("--dtype", choices=DTYPES, default="f16", help="type of the weight matrices")
    parser.add_argument("--name", help="general.name of the file (default: the folder's name)")
    args = parser.parse_args(argv)
    try:
        out = convert(args.checkpoint, args.out, dtype=args.dtype, name=args.name)
    except (ConversionError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
