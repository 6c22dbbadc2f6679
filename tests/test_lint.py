"""Static checks of the project's own code, as tests: ruff's rules (pyflakes' undefined
names and unused imports among them, the complexity limit), the formatter's check and
mypy. The command lines are scripts/lint.py's, the ones ``scripts/dev lint`` runs; the
settings are pyproject.toml's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lint_module():
    spec = importlib.util.spec_from_file_location("lmsp_lint_script", ROOT / "scripts" / "lint.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lint = _lint_module()


@pytest.mark.parametrize("name", lint.SUITE_CHECKS)
def test_check_passes(name):
    result = lint.run(name)
    assert result.returncode == 0, f"python {' '.join(lint.CHECKS[name])}:\n{result.stdout}{result.stderr}"


def test_lint_runs_every_check():
    # every check the script runs is a test: the suite's own or one above
    assert set(lint.CHECKS) == {*lint.SUITE_CHECKS, "limits", "clang-format"}
    assert (ROOT / "tests" / "test_limits.py").is_file()
    assert (ROOT / "tests" / "test_format.py").is_file()
