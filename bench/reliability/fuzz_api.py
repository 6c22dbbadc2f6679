"""Fuzz the HTTP API of a real service from its OpenAPI document (schemathesis).

Starts ``lmsp serve`` on a fresh data directory, then runs ``--examples``
generated requests for every operation of ``/openapi.json`` with the
bootstrap admin token, and counts 5xx answers and schema violations (goal:
zero of each). The service must still be alive at the end.

    python bench/reliability/fuzz_api.py --examples 200 [--json OUT]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rel_fuzz import fuzz  # noqa: E402
from rel_harness import Server  # noqa: E402


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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=200, help="generated cases per operation")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fuzz-")))
        workdir.mkdir(parents=True, exist_ok=True)
        summary = run(workdir, args.examples, args.seed)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 1 if summary["failures"] or summary["server_errors"] or summary["workers_replaced"] else 0


if __name__ == "__main__":
    sys.exit(main())
