"""The demo model tool: deterministic bytes, readable metadata, clear errors."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from lmsp.models import demo
from lmsp.models.demo import CHAT_TEMPLATE, DemoModelSpec, write_demo_model

# small enough to write in a fraction of a second
SMALL = dict(n_embd=32, n_layer=1, n_head=2, n_head_kv=1, n_ff=64)


@pytest.fixture(scope="module")
def tiny(demo_model_path: Path) -> gguf.GGUFReader:
    # parsing the 32000-token vocabulary takes about a second: read it once
    return gguf.GGUFReader(demo_model_path)


def _field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def test_same_options_give_the_same_bytes(demo_model_path: Path, tmp_path: Path) -> None:
    again = write_demo_model(tmp_path / "again.gguf")
    assert again.read_bytes() == demo_model_path.read_bytes()


def test_another_seed_gives_other_weights(demo_model_path: Path, tiny: gguf.GGUFReader,
                                         tmp_path: Path) -> None:
    other = write_demo_model(tmp_path / "other.gguf", seed=1).read_bytes()
    base = demo_model_path.read_bytes()
    assert len(other) == len(base)
    # same metadata and tensor directory, different weights in every tensor
    assert other[:tiny.data_offset] == base[:tiny.data_offset]
    for t in tiny.tensors:
        start, end = t.data_offset, t.data_offset + t.n_bytes
        assert other[start:end] != base[start:end], t.name


def test_metadata_reads_back(tiny: gguf.GGUFReader) -> None:
    r = tiny
    spec = DemoModelSpec()
    assert _field(r, "general.architecture") == "llama"
    assert _field(r, "general.name") == "lmsp-demo-tiny"
    assert _field(r, "general.file_type") == 0
    assert _field(r, "llama.context_length") == 4096
    assert _field(r, "llama.embedding_length") == spec.n_embd
    assert _field(r, "llama.block_count") == spec.n_layer
    assert _field(r, "llama.feed_forward_length") == spec.n_ff
    assert _field(r, "llama.attention.head_count") == spec.n_head
    assert _field(r, "llama.attention.head_count_kv") == spec.n_head_kv
    assert _field(r, "llama.rope.dimension_count") == spec.n_embd // spec.n_head
    assert _field(r, "llama.rope.freq_base") == pytest.approx(10000.0)
    assert _field(r, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    assert _field(r, "llama.vocab_size") == 32000
    assert _field(r, "tokenizer.chat_template") == CHAT_TEMPLATE
    assert "<|im_start|>" in CHAT_TEMPLATE


def test_tokenizer_is_copied_from_the_vocabulary(tiny: gguf.GGUFReader) -> None:
    model = tiny
    vocab = gguf.GGUFReader(demo.find_vocab())
    copied = [k for k in vocab.fields if k.startswith("tokenizer.")]
    assert {"tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
            "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
            "tokenizer.ggml.add_bos_token"} <= set(copied)
    for key in copied:
        assert model.fields[key].types == vocab.fields[key].types, key
        assert model.fields[key].contents() == vocab.fields[key].contents(), key
    tokens = _field(model, "tokenizer.ggml.tokens")
    assert len(tokens) == 32000
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert _field(model, "tokenizer.ggml.bos_token_id") == 1
    assert _field(model, "tokenizer.ggml.eos_token_id") == 2


def test_tensors_have_the_llama_layout(tiny: gguf.GGUFReader) -> None:
    r = tiny
    spec = DemoModelSpec()
    e, hd = spec.n_embd, spec.n_embd // spec.n_head
    want = {
        "token_embd.weight": (32000, e),
        "output_norm.weight": (e,),
        "output.weight": (32000, e),
    }
    for i in range(spec.n_layer):
        want.update({
            f"blk.{i}.attn_norm.weight": (e,),
            f"blk.{i}.attn_q.weight": (spec.n_head * hd, e),
            f"blk.{i}.attn_k.weight": (spec.n_head_kv * hd, e),
            f"blk.{i}.attn_v.weight": (spec.n_head_kv * hd, e),
            f"blk.{i}.attn_output.weight": (e, spec.n_head * hd),
            f"blk.{i}.ffn_norm.weight": (e,),
            f"blk.{i}.ffn_gate.weight": (spec.n_ff, e),
            f"blk.{i}.ffn_up.weight": (spec.n_ff, e),
            f"blk.{i}.ffn_down.weight": (e, spec.n_ff),
        })
    got = {t.name: t for t in r.tensors}
    assert set(got) == set(want)
    for name, shape in want.items():
        t = got[name]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, name
        assert tuple(t.data.shape) == shape, name  # numpy order: rows first
        assert np.all(np.isfinite(t.data)), name
    # the scale keeps activations sane: about 1/sqrt(fan_in)
    q = np.array(got["blk.0.attn_q.weight"].data)
    assert 0.5 / np.sqrt(e) < q.std() < 2.0 / np.sqrt(e)


@pytest.mark.parametrize(("dtype", "qtype", "file_type", "tolerance"), [
    # relative to the largest weight: f16 keeps 11 significant bits; q8_0
    # rounds to 1/127 of each 32-value block's largest magnitude
    ("f16", gguf.GGMLQuantizationType.F16, 1, 2.0 ** -11),
    ("q8_0", gguf.GGMLQuantizationType.Q8_0, 7, 1.0 / 127),
])
def test_weight_types(tiny: gguf.GGUFReader, tmp_path: Path, dtype: str, qtype,
                      file_type: int, tolerance: float) -> None:
    r = gguf.GGUFReader(write_demo_model(tmp_path / f"{dtype}.gguf", dtype=dtype))
    assert _field(r, "general.file_type") == file_type
    types = {t.name: t.tensor_type for t in r.tensors}
    assert types["blk.0.attn_q.weight"] == qtype
    assert types["token_embd.weight"] == qtype
    assert types["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32
    # the stored values decode to the f32 model's weights
    ref = {t.name: np.array(t.data) for t in tiny.tensors}
    for t in r.tensors:
        decoded = gguf.quants.dequantize(np.array(t.data), t.tensor_type).reshape(ref[t.name].shape)
        assert np.max(np.abs(decoded - ref[t.name])) <= tolerance * np.max(np.abs(ref[t.name])), t.name


@pytest.mark.parametrize(("options", "message"), [
    ({"n_head": 3}, "multiple of n_head"),
    ({"n_head_kv": 3}, "multiple of n_head_kv"),
    ({"n_layer": 0}, "n_layer must be a positive integer"),
    ({"dtype": "q4_k"}, "dtype must be one of"),
    ({"dtype": "q8_0", "n_embd": 48, "n_head": 4}, "multiples of 32"),
    ({"seed": -1}, "seed must be"),
    ({"n_expert": 4}, "mixture of experts needs"),
    ({"n_expert": 2, "n_expert_used": 3}, "mixture of experts needs"),
    ({"n_expert": -1}, "n_expert must be"),
])
def test_bad_options_are_refused(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write_demo_model(tmp_path / "bad.gguf", **options)
    assert list(tmp_path.iterdir()) == []


def test_unknown_option_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="n_layers"):
        write_demo_model(tmp_path / "bad.gguf", n_layers=2)


def test_missing_vocabulary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="vocabulary"):
        write_demo_model(tmp_path / "m.gguf", vocab=tmp_path / "nowhere.gguf")
    assert not (tmp_path / "m.gguf").exists()


def test_command_line(demo_model_path: Path, tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.gguf"
    argv = [str(out), "--n-embd", "32", "--n-layer", "1", "--n-head", "2", "--n-head-kv", "1",
            "--n-ff", "64", "--seed", "5", "--dtype", "f16", "--n-ctx", "512"]
    assert demo.main(argv) == 0
    assert str(out) in capsys.readouterr().out
    same = write_demo_model(tmp_path / "api.gguf", seed=5, dtype="f16", n_ctx=512, **SMALL)
    assert same.read_bytes() == out.read_bytes()
    longer = write_demo_model(tmp_path / "longer.gguf", seed=5, dtype="f16", **SMALL)
    assert longer.read_bytes() != out.read_bytes()
    # the defaults are the service's demo model
    assert demo.main([str(tmp_path / "default.gguf")]) == 0
    assert (tmp_path / "default.gguf").read_bytes() == demo_model_path.read_bytes()


def test_command_line_error_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main([str(tmp_path / "x.gguf"), "--n-head", "5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err


def test_a_mixture_of_experts(tmp_path: Path) -> None:
    path = write_demo_model(tmp_path / "moe.gguf", n_expert=4, n_expert_used=2)
    r = gguf.GGUFReader(path)
    assert r.fields["llama.expert_count"].contents() == 4
    assert r.fields["llama.expert_used_count"].contents() == 2
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in r.tensors}  # ggml order: fastest first
    assert shapes["blk.0.ffn_gate_inp.weight"] == (64, 4)
    assert shapes["blk.1.ffn_up_exps.weight"] == (64, 128, 4)
    assert shapes["blk.1.ffn_down_exps.weight"] == (128, 64, 4)
    assert "blk.0.ffn_up.weight" not in shapes


def test_native_reader_agrees(demo_model_path: Path, tiny: gguf.GGUFReader) -> None:
    from lmsp.native import read_gguf_info

    info = read_gguf_info(demo_model_path)
    spec = DemoModelSpec()
    assert info["architecture"] == "llama"
    assert info["name"] == _field(tiny, "general.name")
    assert info["quantization"] == "F32"
    assert info["context_length"] == spec.n_ctx
    assert info["chat_template"] == CHAT_TEMPLATE
    assert info["vocab_size"] == 32000
    assert (info["n_embd"], info["n_layer"], info["n_head"], info["n_head_kv"]) == \
        (spec.n_embd, spec.n_layer, spec.n_head, spec.n_head_kv)
    assert info["tensor_count"] == len(tiny.tensors)
    assert info["parameters"] == sum(int(t.n_elements) for t in tiny.tensors)
    assert info["size_bytes"] == demo_model_path.stat().st_size


def test_llama_cpp_reads_the_tokenizer_and_template(demo_model_path: Path) -> None:
    from lmsp.native import Engine

    with Engine(demo_model_path, n_ctx=64, n_parallel=1) as engine:
        assert engine.n_vocab == 32000
        tokens = engine.tokenize("Hello world")
        assert tokens[0] == 1  # add_bos_token from the vocabulary
        assert engine.detokenize(tokens[1:]).strip() == "Hello world"
        text = engine.apply_chat_template([{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Hi"}])
    # llama.cpp recognised the template as ChatML (not its plain fallback)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n")
