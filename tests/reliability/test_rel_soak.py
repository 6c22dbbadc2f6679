"""A short crash soak: the real service SIGKILLed under load, chapter 11 checked after each restart.

The long run (100+ cycles) is ``bench/reliability/soak.py``; this one runs the
same code for a few cycles so that CI sees every invariant checked on every
push.
"""
from __future__ import annotations

import pytest

import soak


@pytest.mark.slow
def test_sigkill_cycles_lose_and_duplicate_nothing(tmp_path):
    report = soak.run_soak(tmp_path, cycles=5, seed=20261129, clients=3, replay_limit=5, log=lambda _: None)
    summary = report.summary()
    assert report.violations == [], "\n".join(str(v) for v in report.violations)
    assert summary["cycles"] == 5 and summary["kills"] >= 5
    # the run did exercise what it claims to check
    assert summary["acknowledged"] > 0
    assert summary["tasks"] > 0 and summary["events"] > summary["tasks"]
    assert summary["in_flight_at_kill"] > 0 and sum(summary["idempotent_retries"].values()) > 0
    assert sum(summary["unfinished_at_restart"].values()) > 0
