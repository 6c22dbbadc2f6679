"""bench/results/: one folder of JSON results, one naming rule (bench/results_path.py)."""
from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import results_path  # noqa: E402

RESULTS = results_path.RESULTS


def test_every_result_follows_the_naming_rule_and_is_a_json_object():
    files = sorted(RESULTS.iterdir())
    assert len(files) > 300
    for path in files:
        match = results_path.NAME.fullmatch(path.name)
        assert match, f"{path.name}: not <YYYYMMDDTHHMMSSZ>-<kind>-<model>.json"
        datetime.strptime(match["time"], "%Y%m%dT%H%M%SZ")
        assert isinstance(json.loads(path.read_text(encoding="utf-8")), dict), path.name


def test_a_result_path_is_named_by_its_start_kind_and_models(tmp_path):
    path = results_path.result_path("serve", "SmolLM2-135M-Instruct.gguf", 0.0, tmp_path)
    assert path == tmp_path / "19700101T000000Z-serve-smollm2-135m-instruct.json"
    several = results_path.result_path("native", ["tiny", "bench"], 86399.0)
    assert several.name == "19700101T235959Z-native-tiny+bench.json"
    assert results_path.result_path("store", None, 0.0).parent == RESULTS
    assert results_path.NAME.fullmatch(results_path.result_path("store", None).name)["model"] == "none"
    with pytest.raises(ValueError, match="kind"):
        results_path.result_path("serve-chat", "m")


def test_a_written_result_says_when_where_and_on_what_it_ran(tmp_path):
    path = results_path.write_result("ubatches", ["m"], {"figures": {"x": 1}}, started=0.0, folder=tmp_path)
    saved = json.loads(path.read_text())
    assert path.name == "19700101T000000Z-ubatches-m.json"
    assert saved["benchmark"] == "ubatches" and saved["time"] == "1970-01-01T00:00:00Z"
    assert "commit" in saved and saved["machine"]["nproc"] >= 1 and saved["figures"] == {"x": 1}
