"""A llama-architecture GGUF with fixed random weights and a real tokenizer.

The weights come from a seeded numpy generator, so the same options always
give the same bytes. The vocabulary is the 32000-token SentencePiece llama
vocabulary shipped with llama.cpp (``ggml-vocab-llama-spm.gguf``), so text goes
in and out through a real tokenizer; a ChatML chat template is set so that
messages can be formatted.

    python -m lmsp.models.demo OUT.gguf [--n-embd N --n-layer N --dtype f16 ...]

The defaults (:class:`DemoModelSpec`) make the service's demo model: 17 MB, most
of it the 32000-row embedding and output matrices, written in well under a
second. Every field of the spec is an option, so any llama shape can be made.

Tensor layout (numpy shapes, rows = output features; GGUF stores the reverse
order of dimensions): ``token_embd.weight`` [n_vocab, n_embd],
``blk.N.attn_q.weight`` [n_head*head_dim, n_embd],
``blk.N.attn_k/v.weight`` [n_head_kv*head_dim, n_embd],
``blk.N.attn_output.weight`` [n_embd, n_head*head_dim],
``blk.N.ffn_gate/up.weight`` [n_ff, n_embd], ``blk.N.ffn_down.weight`` [n_embd, n_ff],
norms [n_embd] (always f32), ``output.weight`` [n_vocab, n_embd]. Q and K are
used as written with llama.cpp's "normal" rope (rotation of consecutive pairs).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np

from .gguf_write import gguf_writer

if TYPE_CHECKING:
    import gguf

__all__ = [
    "CHAT_TEMPLATE",
    "DTYPES",
    "VOCAB_FILE",
    "DemoModelSpec",
    "find_vocab",
    "main",
    "tensor_specs",
    "write_demo_model",
]

VOCAB_FILE = "ggml-vocab-llama-spm.gguf"

# ChatML; llama.cpp's llama_chat_apply_template recognises it by "<|im_start|>".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

DTYPES = ("f32", "f16", "q8_0")


@dataclass(frozen=True)
class DemoModelSpec:
    """Everything that decides the bytes of a demo model; the defaults are the service's."""

    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx: int = 4096
    seed: int = 0
    dtype: str = "f32"
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-5
    name: str = "lmsp-demo-tiny"
    # a mixture of experts (llama.cpp's llama architecture with expert
    # tensors, as Mixtral): n_expert feed-forward blocks per layer, of which
    # each token takes n_expert_used; 0 for a dense model
    n_expert: int = 0
    n_expert_used: int = 0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def validate(self) -> None:
        for field in ("n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "n_ctx"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field} must be a positive integer, got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if self.head_dim % 2:
            raise ValueError(f"the head size n_embd/n_head ({self.head_dim}) must be even for rope")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})")
        if self.dtype == "q8_0" and (self.n_embd % 32 or self.n_ff % 32):
            raise ValueError(
                f"q8_0 needs n_embd and n_ff to be multiples of 32 (got n_embd={self.n_embd}, n_ff={self.n_ff})"
            )
        for field in ("n_expert", "n_expert_used"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{field} must be a non-negative integer, got {value!r}")
        if (self.n_expert == 0) != (self.n_expert_used == 0) or self.n_expert_used > self.n_expert:
            raise ValueError(
                "a mixture of experts needs 0 < n_expert_used <= n_expert "
                f"(got n_expert={self.n_expert}, n_expert_used={self.n_expert_used})"
            )
        if not self.rms_eps > 0 or not self.rope_freq_base > 0:
            raise ValueError("rms_eps and rope_freq_base must be positive")


# GGUF general.file_type (llama_ftype) for each weight type
_FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7}


def find_vocab(extra: os.PathLike[str] | str | None = None) -> Path:
    """Where the llama SPM vocabulary file is: an explicit path, the package's
    ``data/`` folder (installed by CMake), or the unpacked llama.cpp source."""
    if extra is not None:
        if not Path(extra).is_file():
            raise FileNotFoundError(f"the tokenizer vocabulary {extra} does not exist")
        return Path(extra)
    package = Path(__file__).resolve().parents[1]
    candidates = [
        package / "data" / VOCAB_FILE,
        package.parents[1] / "third_party" / "llama.cpp" / "models" / VOCAB_FILE,
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"the tokenizer vocabulary {VOCAB_FILE} was not found (looked in: "
        + ", ".join(str(c) for c in candidates)
        + "); run third_party/fetch_llama.py or reinstall the package"
    )


def tensor_specs(spec: DemoModelSpec, n_vocab: int) -> list[tuple[str, tuple[int, ...], str, float, float]]:
    """(name, numpy shape, weight type, mean, std) of every tensor, in file order."""
    hd = spec.head_dim
    e, ff = spec.n_embd, spec.n_ff
    w = spec.dtype
    norm = ("f32", 1.0, 0.1)  # norms: around 1, with some spread so that they matter
    out: list[tuple[str, tuple[int, ...], str, float, float]] = [
        ("token_embd.weight", (n_vocab, e), w, 0.0, 1.0),
    ]
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (e,), *norm),
            (p + "attn_q.weight", (spec.n_head * hd, e), w, 0.0, e**-0.5),
            (p + "attn_k.weight", (spec.n_head_kv * hd, e), w, 0.0, e**-0.5),
            (p + "attn_v.weight", (spec.n_head_kv * hd, e), w, 0.0, e**-0.5),
            (p + "attn_output.weight", (e, spec.n_head * hd), w, 0.0, (spec.n_head * hd) ** -0.5),
            (p + "ffn_norm.weight", (e,), *norm),
        ]
        if spec.n_expert:
            x = spec.n_expert
            out += [
                (p + "ffn_gate_inp.weight", (x, e), "f32", 0.0, e**-0.5),
                (p + "ffn_gate_exps.weight", (x, ff, e), w, 0.0, e**-0.5),
                (p + "ffn_down_exps.weight", (x, e, ff), w, 0.0, ff**-0.5),
                (p + "ffn_up_exps.weight", (x, ff, e), w, 0.0, e**-0.5),
            ]
        else:
            out += [
                (p + "ffn_gate.weight", (ff, e), w, 0.0, e**-0.5),
                (p + "ffn_up.weight", (ff, e), w, 0.0, e**-0.5),
                (p + "ffn_down.weight", (e, ff), w, 0.0, ff**-0.5),
            ]
    out += [
        ("output_norm.weight", (e,), *norm),
        # a wider spread than 1/sqrt(fan_in) so that next-token choices are not near-uniform
        ("output.weight", (n_vocab, e), w, 0.0, 4.0 * e**-0.5),
    ]
    return out


def _values(spec: DemoModelSpec, index: int, shape: tuple[int, ...], mean: float, std: float) -> np.ndarray:
    # one generator per tensor, keyed by (seed, position): independent of how
    # many tensors come before, so changing n_layer keeps the embedding equal
    rng = np.random.default_rng([spec.seed, index])
    data = rng.standard_normal(shape, dtype=np.float32)
    data *= np.float32(std)
    if mean:
        data += np.float32(mean)
    return data


def _encode(data: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "f32":
        return data
    if dtype == "f16":
        return data.astype(np.float16)
    import gguf

    return gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    n = int(np.prod(shape))
    return {"f32": 4 * n, "f16": 2 * n, "q8_0": n // 32 * 34}[dtype]


@functools.lru_cache(maxsize=4)
def _tokenizer_keys(vocab_path: Path, mtime_ns: int, size: int) -> tuple[tuple, ...]:
    """Every ``tokenizer.*`` key of the vocabulary file as (key, value, type,
    sub type). Parsing 32000 strings takes about a second, so it is cached."""
    import gguf

    reader = gguf.GGUFReader(vocab_path)
    keys = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype, sub = field.types[0], None
        value: object
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == gguf.GGUFValueType.STRING:
                value = tuple(bytes(field.parts[i]) for i in field.data)  # byte-exact
            else:
                value = tuple(field.parts[i].tolist()[0] for i in field.data)
        elif vtype == gguf.GGUFValueType.STRING:
            value = bytes(field.parts[field.data[0]])
        else:
            value = field.parts[field.data[0]].tolist()[0]
        keys.append((key, value, vtype, sub))
    return tuple(keys)


def _copy_tokenizer(writer: gguf.GGUFWriter, vocab_path: Path) -> int:
    """Copy every ``tokenizer.*`` key of the vocabulary file; returns n_vocab."""
    st = vocab_path.stat()
    n_vocab = 0
    for key, value, vtype, sub in _tokenizer_keys(vocab_path.resolve(), st.st_mtime_ns, st.st_size):
        writer.add_key_value(key, value, vtype, sub_type=sub)
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(value)
    if n_vocab == 0:
        raise ValueError(f"{vocab_path} has no tokenizer.ggml.tokens")
    return n_vocab


def _spec_from(options: dict) -> DemoModelSpec:
    known = {f.name for f in dataclasses.fields(DemoModelSpec)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unknown demo model option(s): {', '.join(unknown)}")
    given = {k: v for k, v in options.items() if v is not None}
    spec = dataclasses.replace(DemoModelSpec(), **given)
    spec.validate()
    return spec


def write_demo_model(
    path: os.PathLike[str] | str,
    *,
    vocab: os.PathLike[str] | str | None = None,
    chat_template: str | None = CHAT_TEMPLATE,
    **options,
) -> Path:
    """Write a demo model to ``path`` and return it.

    ``chat_template`` is the Jinja template stored as ``tokenizer.chat_template``
    (ChatML by default; None stores none).

    ``options`` set fields of its :class:`DemoModelSpec` (the defaults otherwise)
    (``n_embd``, ``n_layer``, ``n_head``, ``n_head_kv``, ``n_ff``, ``n_ctx``,
    ``seed``, ``dtype``, ``rope_freq_base``, ``rms_eps``, ``name``,
    ``n_expert``, ``n_expert_used``). The file
    appears atomically: it is written beside ``path`` and renamed into place.
    Raises ``ValueError``/``TypeError`` for bad options and
    ``FileNotFoundError`` when the vocabulary cannot be found.
    """

    spec = _spec_from(options)
    vocab_path = find_vocab(vocab)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gguf_writer(path, "llama") as writer:
        n_vocab = _write_keys(writer, spec, vocab_path, chat_template)
        _write_tensors(writer, spec, n_vocab)
    return path


def _write_keys(writer: gguf.GGUFWriter, spec: DemoModelSpec, vocab_path: Path, chat_template: str | None) -> int:
    """The model's metadata: its shape, the vocabulary's tokenizer, the chat template. Returns n_vocab."""
    import gguf

    writer.add_name(spec.name)
    writer.add_context_length(spec.n_ctx)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_rope_freq_base(spec.rope_freq_base)
    writer.add_layer_norm_rms_eps(spec.rms_eps)
    if spec.n_expert:
        writer.add_expert_count(spec.n_expert)
        writer.add_expert_used_count(spec.n_expert_used)
    writer.add_file_type(_FILE_TYPE[spec.dtype])
    if spec.dtype == "q8_0":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    n_vocab = _copy_tokenizer(writer, vocab_path)
    writer.add_vocab_size(n_vocab)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    return n_vocab


def _write_tensors(writer: gguf.GGUFWriter, spec: DemoModelSpec, n_vocab: int) -> None:
    """The header, the keys, the tensors' table, then the tensors' values."""
    import gguf

    specs = tensor_specs(spec, n_vocab)
    for name, shape, dtype, _, _ in specs:
        raw = gguf.GGMLQuantizationType.Q8_0 if dtype == "q8_0" else None
        np_dtype = np.float16 if dtype == "f16" else np.float32  # element shape for q8_0 too
        writer.add_tensor_info(name, shape, np.dtype(np_dtype), _nbytes(shape, dtype), raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    # one tensor in memory at a time: a large model never sits whole in RAM
    for index, (_, shape, dtype, mean, std) in enumerate(specs):
        writer.write_tensor_data(_encode(_values(spec, index, shape, mean, std), dtype))


def _iter_cli_fields() -> Iterator[tuple[str, type]]:
    for f in dataclasses.fields(DemoModelSpec):
        if f.name == "dtype":
            continue
        yield f.name, {"int": int, "float": float, "str": str}[str(f.type)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lmsp.models.demo",
        description="Write a llama GGUF with fixed random weights and the llama SPM vocabulary.",
    )
    parser.add_argument("out", type=Path, help="the GGUF file to write")
    parser.add_argument("--dtype", choices=DTYPES, help="weight type of the matrices")
    for name, kind in _iter_cli_fields():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=kind)
    parser.add_argument("--vocab", type=Path, help=f"path of {VOCAB_FILE} (default: found automatically)")
    args = parser.parse_args(argv)
    options = {name: getattr(args, name) for name, _ in _iter_cli_fields()}
    options["dtype"] = args.dtype
    try:
        out = write_demo_model(args.out, vocab=args.vocab, **options)
    except (ValueError, TypeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
