"""GGUF metadata without the weights, and clear errors for files that are not
usable models (from read_gguf_info and from Engine alike)."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from lmsp.models.demo import write_demo_model
from lmsp.native import Engine, ModelFormatError, NativeError, read_gguf_info


def header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def gguf_str(s: bytes, length: int | None = None) -> bytes:
    return struct.pack("<Q", len(s) if length is None else length) + s


def kv_str(key: bytes, value: bytes) -> bytes:
    return gguf_str(key) + struct.pack("<I", 8) + gguf_str(value)


ARCH = kv_str(b"general.architecture", b"llama")


def tensor_info(name: bytes, dims: list[int], ggml_type: int = 0, offset: int = 0) -> bytes:
    return gguf_str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + \
        struct.pack("<IQ", ggml_type, offset)


HOSTILE = {
    "empty": b"",
    "magic only": b"GGUF",
    "wrong magic": b"GGML" + bytes(60),
    "random bytes": np.random.default_rng(0).bytes(4096),
    "random after magic": b"GGUF" + np.random.default_rng(1).bytes(4096),
    "version 0": b"GGUF" + struct.pack("<IQQ", 0, 0, 0),
    "absurd tensor count": header(2**62, 0),
    "absurd kv count": header(0, 2**62),
    "absurd key length": header(0, 1) + gguf_str(b"k", 2**60),
    "absurd string length": header(0, 1) + gguf_str(b"general.architecture") + struct.pack("<I", 8) +
                            gguf_str(b"llama", 2**61),
    "absurd array length": header(0, 1) + gguf_str(b"tokenizer.ggml.tokens") + struct.pack("<II", 9, 8) +
                           struct.pack("<Q", 2**60),
    "bad value type": header(0, 1) + gguf_str(b"x") + struct.pack("<I", 999) + bytes(8),
    "too many dims": header(1, 1) + ARCH + tensor_info(b"t", [2] * 100),
    "absurd shape": header(1, 1) + ARCH + tensor_info(b"t", [2**62, 2**62]),
    "bad tensor type": header(1, 1) + ARCH + tensor_info(b"t", [4, 4], ggml_type=9999),
    "data past the end": header(1, 1) + ARCH + tensor_info(b"t", [1024, 1024]),
    "no architecture": header(0, 0),
    "architecture not utf-8": header(0, 1) + kv_str(b"general.architecture", b"\x80llama"),
    "name not utf-8": header(0, 2) + ARCH + kv_str(b"general.name", b"\xffname"),
    "template not utf-8": header(0, 2) + ARCH + kv_str(b"tokenizer.chat_template", b"\xc3("),
    "absurd context length": header(0, 2) + ARCH + gguf_str(b"llama.context_length") + struct.pack("<IQ", 10, 2**63),
    "absurd layer count": header(0, 2) + ARCH + gguf_str(b"llama.block_count") + struct.pack("<IQ", 10, 2**32),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_files_raise_model_format_error(tmp_path: Path, name: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(HOSTILE[name])
    with pytest.raises(ModelFormatError) as info:
        read_gguf_info(str(path))
    assert str(path) in str(info.value)
    with pytest.raises(ModelFormatError):
        Engine(str(path), n_ctx=64, n_parallel=1, n_threads=1)


def test_demo_model_info(demo_model_path: Path) -> None:
    info = read_gguf_info(demo_model_path)  # os.PathLike is fine too
    assert info == read_gguf_info(str(demo_model_path))
    assert info["architecture"] == "llama"
    assert info["name"] == "lmsp-demo-tiny"
    assert info["quantization"] == "F32"
    assert info["vocab_size"] == 32000
    assert info["context_length"] > 0
    assert info["chat_template"].startswith("{% for message in messages %}")
    assert info["n_head"] % info["n_head_kv"] == 0 and info["n_embd"] % info["n_head"] == 0
    assert info["tensor_count"] == 2 + 1 + 9 * info["n_layer"]
    assert info["size_bytes"] == demo_model_path.stat().st_size
    # f32 weights: the parameters are nearly all of the file
    assert 0.9 * info["size_bytes"] < 4 * info["parameters"] < info["size_bytes"]


@pytest.mark.parametrize(("dtype", "name"), [("f16", "F16"), ("q8_0", "Q8_0")])
def test_quantization_names(tmp_path: Path, dtype: str, name: str) -> None:
    path = write_demo_model(tmp_path / f"{dtype}.gguf", dtype=dtype, n_layer=1)
    info = read_gguf_info(str(path))
    assert info["quantization"] == name
    assert info["n_layer"] == 1


@pytest.mark.parametrize("keep", [10, 24, 5000, 0.5, -1])
def test_truncated_files(demo_model_path: Path, tmp_path: Path, keep: float) -> None:
    data = demo_model_path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep % len(data)
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:cut])
    with pytest.raises(ModelFormatError, match="truncated|corrupt"):
        read_gguf_info(str(path))
    with pytest.raises(ModelFormatError):
        Engine(str(path), n_ctx=64, n_parallel=1, n_threads=1)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nothing.gguf"):
        read_gguf_info(str(tmp_path / "nothing.gguf"))
    with pytest.raises(FileNotFoundError):
        Engine(str(tmp_path / "nothing.gguf"))
    with pytest.raises(ModelFormatError, match="not a regular file"):
        read_gguf_info(str(tmp_path))
    with pytest.raises(TypeError):
        read_gguf_info(b"/bytes/path")


def test_unsupported_architecture(demo_model_path: Path, tmp_path: Path) -> None:
    data = demo_model_path.read_bytes()
    value = struct.pack("<I", 8) + gguf_str(b"llama")
    assert data.count(b"general.architecture" + value) == 1
    path = tmp_path / "other-arch.gguf"
    path.write_bytes(data.replace(b"general.architecture" + value,
                                  b"general.architecture" + struct.pack("<I", 8) + gguf_str(b"zzzzz")))
    assert read_gguf_info(str(path))["architecture"] == "zzzzz"
    with pytest.raises(ModelFormatError, match="unsupported model architecture 'zzzzz'"):
        Engine(str(path), n_ctx=64, n_parallel=1, n_threads=1)


def test_a_model_without_weights(tmp_path: Path) -> None:
    path = tmp_path / "empty-llama.gguf"
    path.write_bytes(header(0, 1) + ARCH)
    assert read_gguf_info(str(path))["tensor_count"] == 0
    with pytest.raises(ModelFormatError, match="cannot load model"):
        Engine(str(path), n_ctx=64, n_parallel=1, n_threads=1)
    assert issubclass(ModelFormatError, ValueError) and issubclass(ModelFormatError, NativeError)


def patched_u32(data: bytes, key: bytes, value: int) -> bytes:
    """The demo model with one uint32 hyperparameter changed."""
    field = gguf_str(key) + struct.pack("<I", 4)
    at = data.index(field) + len(field)
    return data[:at] + struct.pack("<I", value) + data[at + 4:]


@pytest.mark.parametrize(("key", "value"), [
    (b"llama.block_count", 0), (b"llama.block_count", 600), (b"llama.block_count", 9),
    (b"llama.attention.head_count", 0), (b"llama.attention.head_count", 3),
    (b"llama.attention.head_count_kv", 0), (b"llama.embedding_length", 0),
])
def test_hyperparameters_that_do_not_match_the_weights(demo_model_path: Path, tmp_path: Path,
                                                       key: bytes, value: int) -> None:
    path = tmp_path / "patched.gguf"
    path.write_bytes(patched_u32(demo_model_path.read_bytes(), key, value))
    read_gguf_info(str(path))  # the header itself is readable
    with pytest.raises(ModelFormatError, match="cannot load model"):
        Engine(str(path), n_ctx=64, n_parallel=1, n_threads=1)
