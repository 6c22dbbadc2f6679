"""Static checks of the project's own Python: no undefined name, no unused import,
no unreachable leftovers that pyflakes can see (an undefined name in code after a
``return`` runs in no test, and fails only when someone moves it)."""
from __future__ import annotations

from pathlib import Path

from pyflakes import api as pyflakes_api  # a test dependency (pyproject's [test])
from pyflakes.reporter import Reporter

ROOT = Path(__file__).resolve().parents[1]


class _Collect:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        if text.strip():
            self.lines.append(text.strip())

    def flush(self) -> None:
        pass


def test_pyflakes_finds_nothing():
    out = _Collect()
    files = sorted(p for folder in ("python", "tests", "bench", "scripts") for p in (ROOT / folder).rglob("*.py")
                   if "third_party" not in p.parts and ".venv" not in p.parts)
    assert files
    for path in files:
        pyflakes_api.checkPath(str(path), Reporter(out, out))
    assert out.lines == [], "\n".join(out.lines)
