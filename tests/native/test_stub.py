"""python/lmsp/_native.pyi tells the truth about the compiled module: the same
names, the same members, the same parameter names and defaults."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import lmsp
from lmsp import _native, native

STUB = Path(lmsp.__file__).with_name("_native.pyi")
DUNDERS = {"__init__", "__enter__", "__exit__"}


def stub_tree() -> ast.Module:
    return ast.parse(STUB.read_text())


def stub_names(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    out: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


def stub_params(fn: ast.FunctionDef) -> list[str]:
    """Parameter names, with "*" where keyword-only ones begin and "=" after
    those with a default."""
    args = fn.args
    positional = args.posonlyargs + args.args
    first_default = len(positional) - len(args.defaults)
    out = [a.arg + ("=" if i >= first_default else "") for i, a in enumerate(positional)]
    if args.kwonlyargs:
        out.append("*")
        out += [a.arg + ("=" if d is not None else "") for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.vararg:
        out.append("*" + args.vararg.arg)
    return out


def native_params(obj) -> list[str]:
    """The same, read from the signature pybind11 writes into the docstring."""
    first = (obj.__doc__ or "").strip().splitlines()[0]
    inner = first[first.index("(") + 1:first.rindex(") ->")]
    out = []
    for part in re.split(r",\s*(?![^\[]*\])", inner):
        part = part.strip()
        if not part:
            continue
        if part in ("*", "*args"):
            out.append(part)
            continue
        name = part.split(":")[0].strip()
        out.append(name + ("=" if "=" in part else ""))
    return out


def public(names) -> set[str]:
    return {n for n in names if not n.startswith("_") or n in DUNDERS}


def test_module_names_match() -> None:
    declared = stub_names(stub_tree().body)
    actual = public(dir(_native)) | {"__version__"}
    assert set(declared) == actual
    assert set(native.__all__) <= actual and "__version__" not in native.__all__


def test_exception_bases_match() -> None:
    for name, node in stub_names(stub_tree().body).items():
        if isinstance(node, ast.ClassDef) and node.bases:
            bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
            assert [b.__name__ for b in getattr(_native, name).__bases__] == bases


@pytest.mark.parametrize("cls", ["Engine", "TextStream"])
def test_class_members_and_parameters_match(cls: str) -> None:
    node = stub_names(stub_tree().body)[cls]
    members = stub_names(node.body)
    klass = getattr(_native, cls)
    actual = {n for n in public(klass.__dict__) if n != "_pybind11_conduit_v1_"}
    assert set(members) == actual
    for name, fn in members.items():
        is_property = any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)
        assert is_property == isinstance(klass.__dict__[name], property), name
        if not is_property and name != "__exit__":
            assert stub_params(fn) == native_params(getattr(klass, name)), name


def test_function_parameters_match() -> None:
    for name, node in stub_names(stub_tree().body).items():
        if isinstance(node, ast.FunctionDef):
            assert stub_params(node) == native_params(getattr(_native, name)), name
