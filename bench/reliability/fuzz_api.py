"""Fuzz the HTTP API of a real service from its OpenAPI document (schemathesis).

Starts ``lmsp serve`` on a fresh data directory, then runs ``--examples``
generated requests for every operation of ``/openapi.json`` with the
bootstrap admin token, and counts 5xx answers and schema violations (goal:
zero of each). The service must still be alive at the end.

    python bench/reliability/fuzz_api.py --examples 200 [--json [OUT]]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rel_fuzz import fuzz  # noqa: E402
from rel_harness import Server, bench_main  # noqa: E402


def run(workdir: Path, examples: int, seed: int) -> dict:
    server = Server(workdir / "data", log=workdir / "server.log")
    server.start()
    try:
        workers = server.worker_pids()
        report = fuzz(f"http://127.0.0.1:{server.port}", server.admin().token, examples=examples, seed=seed)
        server.check_alive()
        summary = report.summary()
        summary["workers_replaced"] = server.worker_pids() != workers
    finally:
        server.stop()
    return summary


def main(argv: list[str] | None = None) -> int:
    def options(ap) -> None:
        ap.add_argument("--examples", type=int, default=200, help="generated cases per operation")
        ap.add_argument("--seed", type=int, default=1)

    return bench_main(__doc__, argv, options, lambda a, workdir, log: run(workdir, a.examples, a.seed),
                      lambda s: s["failures"] or s["server_errors"] or s["workers_replaced"])


if __name__ == "__main__":
    sys.exit(main())
