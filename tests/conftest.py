"""Fixtures shared by every test area."""
from __future__ import annotations

from pathlib import Path

import pytest

from lmsp.demo_model import write_demo_model


@pytest.fixture(scope="session")
def demo_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo model (llama architecture, 32000-token SPM vocabulary,
    f32 weights, seed 0), written once per test session. Read-only: copy it
    before changing it."""
    return write_demo_model(tmp_path_factory.mktemp("models") / "tiny.gguf")
