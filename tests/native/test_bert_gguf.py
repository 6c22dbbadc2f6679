"""The sentence-transformers BERT converter (lmsp.models.bert_gguf) on a small random checkpoint:
the file holds what llama.cpp's ``bert`` architecture reads, the same checkpoint gives the
same bytes, llama.cpp runs it to the vectors and token ids of the numpy reference
(tests/bert_reference.py), and a checkpoint it does not understand is refused in one line."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from lmsp.models.bert_gguf import ConversionError, convert, main
from lmsp.native import Engine, read_gguf_info
from lmsp.runtime.embeddings import Embeddings
from lmsp.models.safetensors_file import SafetensorsError, read_safetensors

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_checkpoint import VOCAB, bert_tensors, write_checkpoint, write_safetensors  # noqa: E402
from bert_reference import reference  # noqa: E402

TEXTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "Cafe naive: it costs $42 (ok)?",
    "Running, walking; reading books -- yes.",
    "zzz qqq xylophone",
    "The [MASK] is on the sea.",
    "  hello\tworld\n ",
    "un" * 20,
    "caf\u00e9 na\u00efve",
    "1 2 3 4 5 6 7 8 9 0 " * 3,
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-bert")


@pytest.fixture(scope="module")
def converted(checkpoint, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gguf")
    return {dtype: convert(checkpoint, out / f"tiny-{dtype}.gguf", dtype=dtype) for dtype in ("f16", "q8_0")}


def fields(path: Path) -> dict:
    import gguf

    reader = gguf.GGUFReader(path)
    out = {}
    for key, field in reader.fields.items():
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            out[key] = [field.contents(i) for i in range(len(field.data))] if len(field.data) < 100 else len(field.data)
        else:
            out[key] = field.contents()
    out["tensors"] = {t.name: t.tensor_type.name for t in reader.tensors}
    return out


def test_the_file_holds_what_llama_cpp_s_bert_reads(converted):
    f = fields(converted["f16"])
    assert f["general.architecture"] == "bert"
    assert (f["bert.context_length"], f["bert.embedding_length"], f["bert.block_count"]) == (64, 64, 2)
    assert (f["bert.feed_forward_length"], f["bert.attention.head_count"]) == (128, 4)
    assert f["bert.attention.causal"] is False
    assert f["bert.pooling_type"] == 1  # mean
    assert f["tokenizer.ggml.model"] == "bert"
    assert f["tokenizer.ggml.tokens"] == len(VOCAB)
    ids = {t: i for i, t in enumerate(VOCAB)}
    assert f["tokenizer.ggml.bos_token_id"] == ids["[CLS]"]
    assert f["tokenizer.ggml.seperator_token_id"] == ids["[SEP]"]
    assert f["tokenizer.ggml.unknown_token_id"] == ids["[UNK]"]
    assert f["tokenizer.ggml.token_type_count"] == 2
    tensors = f["tensors"]
    assert len(tensors) == 5 + 2 * 16  # the pooler and position_ids are left out
    assert tensors["token_embd.weight"] == "F16" and tensors["blk.1.ffn_down.weight"] == "F16"
    assert tensors["token_types.weight"] == "F32" and tensors["blk.0.attn_output_norm.bias"] == "F32"
    assert fields(converted["q8_0"])["tensors"]["blk.0.attn_q.weight"] == "Q8_0"


def test_the_vocabulary_marks_word_starts_as_llama_cpp_looks_them_up(converted):
    import gguf

    reader = gguf.GGUFReader(converted["f16"])
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [field.contents(i) for i in range(len(field.data))]
    ids = {t: i for i, t in enumerate(VOCAB)}
    assert tokens[ids["[CLS]"]] == "[CLS]"
    assert tokens[ids["the"]] == "\u2581the"
    assert tokens[ids["##ing"]] == "ing"


def test_the_same_checkpoint_gives_the_same_bytes(checkpoint, converted, tmp_path):
    again = convert(checkpoint, tmp_path / "again.gguf", dtype="f16")
    assert again.read_bytes() == converted["f16"].read_bytes()


@pytest.mark.parametrize("dtype,floor", [("f16", 0.9999), ("q8_0", 0.999)])
def test_llama_cpp_runs_it_to_the_reference_s_vectors_and_token_ids(checkpoint, converted, dtype, floor, tmp_path):
    ids, vectors = reference(checkpoint, TEXTS, tmp_path)
    with Engine(str(converted[dtype]), n_ctx=64, n_parallel=1, n_threads=1) as engine:
        assert [engine.tokenize(t, add_special=True, parse_special=True) for t in TEXTS] == ids
        got = engine.embed(ids)
    assert got.shape == (len(TEXTS), 64)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cosines = np.sum(got * vectors, axis=1)
    assert cosines.min() >= floor, cosines


def test_the_service_decomposes_hangul_as_bert_s_tokenizer_does(checkpoint, converted, demo_model_path, tmp_path):
    """llama.cpp's NFD leaves a Hangul syllable whole; the model's tokenizer decomposes it
    into jamo, and so does the service before llama.cpp tokenizes a text."""
    text = "\ud55c \ud55c!"
    assert read_gguf_info(converted["f16"])["decomposes_text"] is True
    assert read_gguf_info(demo_model_path)["decomposes_text"] is False
    ids, _ = reference(checkpoint, [text], tmp_path)
    with Engine(str(converted["f16"]), n_ctx=64, n_parallel=1, n_threads=1) as engine:
        assert engine.tokenize(text, add_special=True, parse_special=True) != ids[0]  # llama.cpp alone
        assert Embeddings._tokens(engine, text, 0) == ids[0]
    assert len(ids[0]) == 9  # [CLS], two syllables of three jamo, "!", [SEP]


def test_cls_pooling_is_kept(tmp_path):
    folder = write_checkpoint(tmp_path / "cls", pooling="pooling_mode_cls_token")
    out = convert(folder, tmp_path / "cls.gguf")
    assert fields(out)["bert.pooling_type"] == 2
    ids, vectors = reference(folder, TEXTS[:3], tmp_path)
    with Engine(str(out), n_ctx=64, n_parallel=1, n_threads=1) as engine:
        got = engine.embed(ids)
    assert np.sum(got * vectors, axis=1).min() >= 0.9999


def _edit_json(name: str, change):
    def edit(folder: Path) -> None:
        data = json.loads((folder / name).read_text())
        change(data)
        (folder / name).write_text(json.dumps(data))

    return edit


def _tensors(change):
    def edit(folder: Path) -> None:
        tensors = bert_tensors(len(VOCAB), 64, 2, 128, 64, 0)
        change(tensors)
        write_safetensors(folder / "model.safetensors", tensors)

    return edit


BROKEN = {
    "no config": (lambda f: (f / "config.json").unlink(), "the checkpoint has no config.json"),
    "not bert": (_edit_json("config.json", lambda c: c.update(model_type="roberta")), "not describe a BERT"),
    "relu": (_edit_json("config.json", lambda c: c.update(hidden_act="relu")), "hidden_act 'relu'"),
    "rotary": (_edit_json("config.json", lambda c: c.update(position_embedding_type="rotary")), "absolute"),
    "not wordpiece": (_edit_json("tokenizer.json", lambda t: t["model"].update(type="BPE")), "WordPiece"),
    "max pooling": (
        _edit_json("1_Pooling/config.json", lambda p: p.update(pooling_mode_max_tokens=True)),
        "not one of mean or CLS",
    ),
    "extra module": (
        _edit_json("modules.json", lambda m: m.append({"type": "sentence_transformers.models.Dense", "path": "2"})),
        "are not Transformer, Pooling",
    ),
    "missing tensor": (
        _tensors(lambda t: t.pop("encoder.layer.1.output.dense.bias")),
        "no tensor encoder.layer.1.output.dense.bias",
    ),
    "unknown tensor": (_tensors(lambda t: t.update(extra=np.zeros(3, np.float32))), "does not know: extra"),
    "wrong shape": (
        _tensors(lambda t: t.update({"encoder.layer.0.intermediate.dense.weight": np.zeros((64, 64), np.float32)})),
        "not float [128, 64]",
    ),
    "truncated": (
        lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:-100]),
        "does not fit its offsets",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_checkpoint_it_does_not_understand_is_refused_in_one_line(checkpoint, tmp_path, case):
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint, folder)
    edit, words = BROKEN[case]
    edit(folder)
    with pytest.raises(ConversionError) as caught:
        convert(folder, tmp_path / "out.gguf")
    message = str(caught.value)
    assert words in message and "\n" not in message
    assert not list(tmp_path.glob("out.gguf*"))  # nothing written


def test_the_command_line_converts_and_refuses(checkpoint, tmp_path, capsys):
    assert main([str(checkpoint), str(tmp_path / "cli.gguf"), "--dtype", "q8_0", "--name", "tiny"]) == 0
    assert fields(tmp_path / "cli.gguf")["general.name"] == "tiny"
    assert main([str(tmp_path / "nowhere"), str(tmp_path / "x.gguf")]) == 2
    assert capsys.readouterr().err.strip() == "error: the checkpoint has no config.json"


def test_safetensors_bf16_and_bad_headers(tmp_path):
    bf16 = np.array([1.5, -2.0, 0.25], dtype=np.float32)
    raw = (bf16.view(np.uint32) >> 16).astype(np.uint16)
    write_safetensors(tmp_path / "a.safetensors", {"x": raw}, {"x": "BF16"})
    kind, array = read_safetensors(tmp_path / "a.safetensors")["x"]
    assert kind == "BF16" and (array.astype(np.uint32) << 16).view(np.float32).tolist() == bf16.tolist()
    (tmp_path / "b.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(SafetensorsError, match="declares a header"):
        read_safetensors(tmp_path / "b.safetensors")
    (tmp_path / "c.safetensors").write_bytes(b"\x02" + b"\x00" * 7 + b"[]")
    with pytest.raises(SafetensorsError, match="not a JSON object"):
        read_safetensors(tmp_path / "c.safetensors")
