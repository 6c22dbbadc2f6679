"""A short schemathesis run against a live service: zero 5xx, zero schema violations.

The long run (thousands of cases) is ``bench/reliability/fuzz_api.py``.
"""
from __future__ import annotations

import pytest

from rel_fuzz import fuzz


@pytest.mark.slow
def test_generated_requests_from_the_openapi_document(service):
    workers = service.worker_pids()
    report = fuzz(f"http://127.0.0.1:{service.port}", service.admin().token, examples=15, seed=3)
    summary = report.summary()
    assert summary["failures"] == 0, "\n".join(report.failures)
    assert summary["server_errors"] == 0
    assert summary["operations"] >= 20 and summary["cases"] >= 250
    service.check_alive()
    assert service.worker_pids() == workers
