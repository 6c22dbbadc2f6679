#!/usr/bin/env python3
"""The project's static checks, one command line each.

``scripts/dev lint`` runs them all and fails when any fails; the test suite runs
the same command lines (tests/test_lint.py, tests/test_limits.py for the size
limits and tests/test_format.py for the C++ style), so a violation fails
``scripts/dev test`` too. The settings (line length,
rules, complexity limit, formatter style, mypy strictness) are in pyproject.toml.

    scripts/lint.py [CHECK ...]     run the named checks (default: all)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> arguments to the interpreter, run in the repository root
CHECKS: dict[str, list[str]] = {
    "ruff-check": ["-m", "ruff", "check", "--no-cache", "python/lmsp", "tests", "bench", "scripts"],
    # one line per file to reformat (`ruff format --diff` shows the changes, `ruff format` makes them)
    "ruff-format": ["-m", "ruff", "format", "--no-cache", "--check", "--output-format", "concise", "python/lmsp"],
    "mypy": ["-m", "mypy"],  # the files and the strictness: pyproject.toml's [tool.mypy]
    # what ruff cannot express (lines per file and per function): a test of its own
    "limits": ["-m", "pytest", "-q", "--no-header", "-p", "no:cacheprovider", "tests/test_limits.py"],
    # the C++ of csrc/ against .clang-format (clang-format itself is not Python): a test of its own
    "clang-format": ["-m", "pytest", "-q", "--no-header", "-p", "no:cacheprovider", "tests/test_format.py"],
}

# the checks that tests/test_lint.py runs (the limits and the C++ style are tests already)
SUITE_CHECKS = ["ruff-check", "ruff-format", "mypy"]


def command(name: str) -> list[str]:
    return [sys.executable, *CHECKS[name]]


def run(name: str) -> subprocess.CompletedProcess[str]:
    """One check, its output captured."""
    return subprocess.run(command(name), cwd=ROOT, capture_output=True, text=True, check=False)


def main(argv: list[str]) -> int:
    names = argv or list(CHECKS)
    unknown = [name for name in names if name not in CHECKS]
    if unknown:
        print(f"lint: unknown check {', '.join(unknown)} (checks: {', '.join(CHECKS)})", file=sys.stderr)
        return 2
    failed = []
    for name in names:
        print(f"== {name}: python {' '.join(CHECKS[name])}", flush=True)
        if subprocess.run(command(name), cwd=ROOT, check=False).returncode != 0:
            failed.append(name)
    if failed:
        print(f"lint: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print("lint: every check passes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
