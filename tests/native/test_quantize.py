"""lmsp.native.quantize: llama.cpp's quantizer in the module."""
from __future__ import annotations

from pathlib import Path

import pytest

from lmsp.demo_model import write_demo_model
from lmsp.native import QUANTIZE_TYPES, ModelFormatError, NativeError, quantize, read_gguf_info


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
