"""One gevent worker SIGKILLed while it runs tasks; the master stays and recovers them (B.9).

The long run is ``bench/reliability/worker_kill.py --rounds N``.
"""
from __future__ import annotations

import pytest

import worker_kill


@pytest.mark.slow
def test_killed_worker_is_replaced_and_its_tasks_follow_their_policy(tmp_path):
    report = worker_kill.run_worker_kill(tmp_path, rounds=2, seed=7, lease_seconds=2.0, log=lambda _: None)
    summary = report.summary()
    assert report.violations == [], "\n".join(str(v) for v in report.violations)
    assert summary["workers_killed"] == 2
    # the killed worker did hold unfinished tasks, and every task of the rounds finished
    assert sum(summary["owned_by_killed_worker"].values()) >= 2
    assert sum(summary["outcomes"].values()) == summary["tasks"] == 8
