"""Size limits that the linter cannot express: no file of the package (python/lmsp),
of the benchmarks (bench/) or of the extension's sources (csrc/, our .cpp and .h)
over 600 lines, no Python function of the package or the benchmarks over 60 lines
(from its ``def`` to its last line, nested functions counted in the one around
them). ruff holds the complexity limit."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 60

def _files() -> list[Path]:
    package = [*(ROOT / "python" / "lmsp").rglob("*.py"), *(ROOT / "python" / "lmsp").rglob("*.pyi"),
               *(ROOT / "bench").rglob("*.py")]
    native = [p for suffix in ("*.cpp", "*.h") for p in (ROOT / "csrc").rglob(suffix)]
    return sorted(package + native)


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, lines) of every function under tree."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = prefix + node.name
            if not isinstance(node, ast.ClassDef):
                yield name, node.end_lineno - node.lineno + 1
            yield from _functions(node, name + ".")
        else:
            yield from _functions(node, prefix)


def offenders() -> dict[str, int]:
    """Every file and function over its limit, with its number of lines."""
    found: dict[str, int] = {}
    for path in _files():
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_FILE_LINES:
            found[_name(path)] = lines
        if path.suffix in (".py", ".pyi"):
            for function, length in _functions(ast.parse(text, filename=str(path))):
                if length > MAX_FUNCTION_LINES:
                    found[f"{_name(path)}::{function}"] = length
    return found


def test_the_sources_are_found():
    names = {_name(path) for path in _files()}
    assert "python/lmsp/cli/command.py" in names and "csrc/engine.h" in names and "bench/serving/cli.py" in names
    assert not any("third_party" in name for name in names)


def test_no_file_or_function_over_its_limit():
    found = offenders()
    assert not found, "over the limits (files 600 lines, functions 60):\n" + "\n".join(
        f"  {name}: {lines} lines" for name, lines in sorted(found.items())
    )


def test_functions_are_measured_from_def_to_last_line():
    source = "class A:\n    def f(self):\n        def g():\n            pass\n        return 1\n"
    assert dict(_functions(ast.parse(source))) == {"A.f": 4, "A.f.g": 2}
