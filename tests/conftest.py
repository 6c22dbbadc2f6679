"""Fixtures shared by every test area."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lmsp.models.demo import write_demo_model


# Files of the native and real-model tiers whose outcome does not depend on the
# x86 build's instruction set: the ARM tiles' check builds its own code, and the
# schema property test checks refusals and the grammar's validity (240 requests).
NOT_ISA_DEPENDENT = ("test_tile_matmul_arm.py", "test_schema_property.py")
NATIVE = Path(__file__).parent / "native"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--isa-tier", action="store_true",
        help="only the tests whose outcome can depend on the instruction set the extension was built for: "
             "tests/native and the real-model tests, less NOT_ISA_DEPENDENT (tests/conftest.py)",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``--isa-tier`` collects only the files that can hold its tests: those of
    tests/native and those that name the real_model mark (the mark decides below)."""
    if not config.getoption("--isa-tier") or collection_path.suffix != ".py" \
            or not collection_path.name.startswith("test_"):
        return None
    if collection_path.name in NOT_ISA_DEPENDENT:
        return True
    if NATIVE in collection_path.parents or "real_model" in collection_path.read_text(encoding="utf-8"):
        return None
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--isa-tier`` (``scripts/dev``'s x86-64-v3 tier): the native and real-model tests, in one run."""
    if not config.getoption("--isa-tier"):
        return

    def kept(item: pytest.Item) -> bool:
        if item.path.name in NOT_ISA_DEPENDENT:
            return False
        return NATIVE in item.path.parents or item.get_closest_marker("real_model") is not None

    selected, deselected = [], []
    for item in items:
        (selected if kept(item) else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


@pytest.fixture(scope="session")
def demo_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo model (llama architecture, 32000-token SPM vocabulary,
    f32 weights, seed 0), written once per test session. Read-only: copy it
    before changing it."""
    return write_demo_model(tmp_path_factory.mktemp("models") / "tiny.gguf")


@pytest.fixture(scope="session")
def small_shape() -> dict:
    """Options of ``write_demo_model`` for a shape whose rows (256 and 768) are whole
    K-quant blocks, in f16: ``write_demo_model(path, **{**small_shape, "n_layer": 1})``."""
    return {"n_embd": 256, "n_layer": 4, "n_head": 8, "n_head_kv": 4, "n_ff": 768, "dtype": "f16",
            "name": "lmsp-demo-small"}


@pytest.fixture(scope="session")
def catalog_model() -> Callable[[str], Path]:
    """``catalog_model(name)``: the GGUF file of a catalog model in the user's cache
    (``lmsp.models.catalog.ensure_model``: fetched on the first run, checked once a session).
    Read-only. Where it cannot be had (no network on a first run), the test fails."""
    from lmsp.models.catalog import ensure_model

    paths: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in paths:
            paths[name] = ensure_model(name)
        return paths[name]

    return get


@pytest.fixture(scope="session")
def smollm2_path(catalog_model) -> Path:
    """SmolLM2 135M Instruct (Q4_1, ChatML), the model ``scripts/dev serve`` serves."""
    return catalog_model("smollm2-135m-instruct")
