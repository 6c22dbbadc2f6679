"""Power cut under durability ``full``: every acknowledged task is in the fsynced bytes.

The service runs under ``strace``; the trace is replayed into the bytes each
database file had at its last fsync, and those are checked at every ``202``
(see ``bench/reliability/powercut.py`` for the method and the long run).
"""
from __future__ import annotations

import shutil

import pytest

import powercut


@pytest.fixture
def traced(tmp_path, demo_model_path):
    assert shutil.which("strace"), "strace is needed for the power-cut check (apt-get install strace)"

    def run(durability: str) -> dict:
        workdir = tmp_path / durability
        workdir.mkdir()
        return powercut.run(workdir, 30, 5, 10, demo_model_path, durability=durability, log=lambda _: None)

    return run


@pytest.mark.slow
def test_acknowledged_tasks_survive_losing_everything_not_fsynced(traced):
    summary = traced("full")
    assert summary["acknowledged_202"] >= 20 and summary["fsyncs"] > 0
    assert summary["images_checked"]["durable_images"] >= summary["acknowledged_202"]
    assert summary["violations"] == 0, summary["first_violations"]


@pytest.mark.slow
def test_the_check_sees_the_losses_that_durability_normal_allows(traced):
    """The same check on ``normal`` (WAL synced at checkpoints only) finds lost
    acknowledgements, as the store documents: the method can fail."""
    summary = traced("normal")
    assert summary["acknowledged_202"] >= 20
    assert summary["acknowledged_lost"] > 0
