"""The import graph of the package keeps the direction of docs/ARCHITECTURE.md:
api -> runtime -> store; the store imports nothing of the api or the runtime; only
the runtime imports the native engine; the contracts import none of them. Every
import counts, also one inside a function or under TYPE_CHECKING."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "lmsp"

ROOMS = {
    "api": ("lmsp.api", "lmsp.app"),
    "runtime": ("lmsp.runtime",),
    "store": ("lmsp.store",),
    "native": ("lmsp.native", "lmsp._native"),
    "contracts": ("lmsp.contracts",),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The modules ``path`` imports, relative imports resolved (``from . import x`` as ``pkg.x``)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def room_of(module: str) -> str | None:
    for room, prefixes in ROOMS.items():
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return room
    return None


def graph() -> dict[str, set[str]]:
    """Every module of the package -> the rooms it imports (its own excluded)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        rooms = {room_of(imported) for imported in imports(path)}
        out[name] = {room for room in rooms if room is not None and room != room_of(name)}
    return out


def offenders(room: str | None, forbidden: set[str]) -> dict[str, set[str]]:
    return {name: rooms & forbidden for name, rooms in graph().items() if room_of(name) == room and rooms & forbidden}


def test_the_store_imports_nothing_of_the_api_the_runtime_or_the_engine():
    assert offenders("store", {"api", "runtime", "native"}) == {}


def test_the_runtime_imports_nothing_of_the_api():
    assert offenders("runtime", {"api"}) == {}


def test_the_api_sees_the_runtime_through_the_contracts_only():
    """lmsp.app builds the service (a store, a runtime, the app over them); the API's own
    modules drive the runtime through lmsp.contracts.RuntimeAPI."""
    api_modules = {name: rooms for name, rooms in graph().items() if name.startswith("lmsp.api")}
    assert api_modules and not {name for name, rooms in api_modules.items() if "runtime" in rooms}
    assert "runtime" in graph()["lmsp.app"]


def test_only_the_runtime_imports_the_native_engine():
    importers = {name for name, rooms in graph().items() if "native" in rooms}
    assert importers and {room_of(name) for name in importers} == {"runtime"}, importers


def test_the_contracts_import_nothing_of_the_package():
    contracts = PACKAGE / "contracts.py"
    assert {module for module in imports(contracts) if module.startswith("lmsp")} == set()


def test_imports_are_found_with_their_relative_forms_resolved():
    runtime = PACKAGE / "runtime"
    assert "lmsp.store.db" in imports(runtime / "watcher.py")  # from ..store.db import no_wait
    assert "lmsp.native" in imports(runtime / "scheduler.py")  # from .. import native, inside a method
    assert "lmsp.runtime.state" in imports(runtime / "committer.py")  # from .state import ...
    assert "lmsp.runtime.startup" in imports(runtime / "__init__.py")  # a package's own relative import
    assert room_of("lmsp.runtime.core") == "runtime" and room_of("lmsp.apiary") is None
