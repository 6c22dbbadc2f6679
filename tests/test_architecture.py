"""The import graph of the package keeps the direction of docs/ARCHITECTURE.md:
api -> service -> runtime (through the contracts) -> store, with wire (the request
checks) beside them; the store imports nothing of the layers above it; only the
runtime imports the native engine; the contracts import none of them; no module
imports itself through others, in any folder; and the document names every module.
Every import counts, also one inside a function or under TYPE_CHECKING."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "lmsp"

ROOMS = {
    "api": ("lmsp.api", "lmsp.app"),
    "service": ("lmsp.service",),
    "wire": ("lmsp.wire",),
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


def test_the_store_imports_nothing_of_the_layers_above_it_or_the_engine():
    assert offenders("store", {"api", "service", "wire", "runtime", "native"}) == {}


def test_the_runtime_imports_nothing_of_the_api_or_the_service():
    assert offenders("runtime", {"api", "service", "wire"}) == {}


def test_the_service_knows_neither_http_nor_the_runtime_itself():
    """The task service drives the runtime through lmsp.contracts.RuntimeAPI."""
    assert offenders("service", {"api", "runtime", "native"}) == {}


def test_the_request_checks_import_no_layer():
    assert offenders("wire", {"api", "service", "runtime", "store", "native"}) == {}


def test_the_api_sees_the_runtime_through_the_contracts_only():
    """lmsp.app builds the service (a store, a runtime, the app over them); the API's own
    modules drive the runtime through lmsp.contracts.RuntimeAPI."""
    api_modules = {name: rooms for name, rooms in graph().items() if name.startswith("lmsp.api")}
    assert api_modules and not {name for name, rooms in api_modules.items() if rooms & {"runtime", "native"}}
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


def module_graph() -> dict[str, set[str]]:
    """Every module of the package -> the modules of the package it imports (``from
    pkg import mod`` counts as importing ``pkg.mod``, not the package's face)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = {m for m in imports(path) if m in modules and m != name}
        # an import of a package's submodule is not one of the package's face
        faces = {m for m in found if any(other.startswith(m + ".") for other in found)}
        out[name] = found - faces
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others():
    assert cycles(module_graph()) == []


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_architecture_document_names_every_module():
    """Each module by its path in the package (``api/chat.py``), a package's face by its
    folder (``service/``)."""
    text = (PACKAGE.parents[1] / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py":
            rel = rel[: -len("__init__.py")] or "lmsp/"
        elif path.name == "__main__.py":
            continue
        if f"`{rel}`" not in text and f"`lmsp/{rel}`" not in text:
            missing.append(rel)
    assert missing == []

