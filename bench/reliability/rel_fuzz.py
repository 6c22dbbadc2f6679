"""Fuzz a running service from its own OpenAPI document with schemathesis.

Every operation of ``/openapi.json`` gets ``examples`` generated requests
(valid and invalid by the schema), sent with an admin token so that every
route is reachable. Each answer is checked for: no 5xx (``not_a_server_error``),
a status the document declares for the operation, a declared content type,
and a body that conforms to the declared schema of that status.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import schemathesis
from hypothesis import HealthCheck, Phase, given, seed as hseed, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                               status_code_conformance)

__all__ = ["FuzzReport", "fuzz"]

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@dataclass
class FuzzReport:
    cases: int = 0
    operations: int = 0
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict:
        return {"operations": self.operations, "cases": self.cases,
                "http_statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "server_errors": sum(v for k, v in self.statuses.items() if k >= 500),
                "failures": len(self.failures), "first_failures": self.failures[:20],
                "seconds": round(self.seconds, 1)}


def fuzz(base_url: str, token: str, *, examples: int = 25, seed: int = 0,
         skip: tuple[str, ...] = (), timeout: float = 30.0) -> FuzzReport:
    """Run ``examples`` cases per operation; failures are collected, not raised."""
    report = FuzzReport()
    t0 = time.monotonic()
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    headers = {"Authorization": f"Bearer {token}"}
    for result in schema.get_all_operations():
        operation = result.ok()
        label = f"{operation.method.upper()} {operation.path}"
        if any(label.startswith(s) for s in skip):
            continue
        report.operations += 1
        failures: list[str] = []

        @hseed(seed)
        @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def run(case) -> None:
            response = case.call(base_url=base_url, headers=headers, timeout=timeout)
            report.cases += 1
            report.statuses[response.status_code] += 1
            try:
                case.validate_response(response, checks=CHECKS, headers=headers)
            except Exception as exc:   # a check failed: keep the first lines, go on
                text = str(exc).strip().splitlines()
                # run() is called below, in this same iteration: the loop's current values are meant
                failures.append(f"{label} -> {response.status_code}: " + " | ".join(text[:6])[:600])  # noqa: B023

        run()
        # one line per distinct failure of the operation
        report.failures += sorted(set(failures))
    report.seconds = time.monotonic() - t0
    return report
