"""bench/bench_models.py: the names the benchmarks take, resolved to model files."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_models  # noqa: E402


def test_the_default_models_are_catalog_models():
    from lmsp.models import catalog

    names = bench_models.DEFAULT_MODELS.split(",")
    assert names == ["smollm2-135m-instruct", "gemma-3-270m"]
    assert set(names) <= set(catalog.load_catalog())


def test_a_catalog_name_is_fetched_through_the_catalog(monkeypatch, tmp_path):
    from lmsp.models import catalog

    asked = []
    fake = tmp_path / "gemma-3-270m.gguf"
    fake.write_bytes(b"GGUF")
    monkeypatch.setattr(catalog, "ensure_model", lambda name: asked.append(name) or fake)
    got = bench_models.resolve(["gemma-3-270m"], [], tmp_path / "demo")
    assert asked == ["gemma-3-270m"]
    assert got == [bench_models.BenchModel("gemma-3-270m", fake, "catalog")]


def test_a_demo_shape_is_written_once_and_a_file_is_taken_as_it_is(tmp_path):
    first = bench_models.resolve(["tiny"], [], tmp_path)
    assert first[0].kind == "demo" and first[0].path == tmp_path / "tiny.gguf" and first[0].path.is_file()
    stamp = first[0].path.stat().st_mtime_ns
    again = bench_models.resolve([], [first[0].path], tmp_path)
    assert again == [bench_models.BenchModel("tiny", first[0].path, "file")]
    assert bench_models.resolve(["tiny"], [], tmp_path)[0].path.stat().st_mtime_ns == stamp
    assert bench_models.has_chat_template(first[0].path)


def test_an_unknown_name_or_a_missing_file_stops_with_what_is_known(tmp_path):
    with pytest.raises(SystemExit, match="unknown model 'nope'.*smollm2-135m-instruct.*tiny"):
        bench_models.resolve(["nope"], [], tmp_path)
    with pytest.raises(SystemExit, match="does not exist"):
        bench_models.resolve([], [tmp_path / "missing.gguf"], tmp_path)


def test_every_demo_shape_is_a_valid_demo_model_spec():
    from lmsp.models.demo import DemoModelSpec

    assert set(bench_models.DEMO_SHAPES) == {"tiny", "small", "bench", "large"}
    assert DemoModelSpec(**bench_models.DEMO_SHAPES["tiny"]) == DemoModelSpec()
    for shape in bench_models.DEMO_SHAPES.values():
        DemoModelSpec(**shape).validate()
