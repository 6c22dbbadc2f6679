"""Fixtures of the native engine tests: engines on the demo model.

Engines here use one thread: on a small shared machine ggml's spinning
barriers make two threads much slower than one for a model this size.

LMSP_TEST_N_GPU_LAYERS=99 runs the fixtures' engines on a GPU instead, with an
extension built with CUDA (bench/gpu.sh does), to see which of these
properties hold there too.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from native_helpers import N_GPU_LAYERS

from lmsp.native import Engine


@pytest.fixture(scope="module")
def engine(demo_model_path: Path) -> Iterator[Engine]:
    """A shared engine: 4 parallel sequences of 512 tokens. Tests leave it idle."""
    e = Engine(str(demo_model_path), n_ctx=512, n_parallel=4, n_threads=1, n_gpu_layers=N_GPU_LAYERS)
    yield e
    e.close()


@pytest.fixture
def make_engine(demo_model_path: Path) -> Iterator:
    """Builds fresh engines (closed at the end of the test)."""
    made: list[Engine] = []

    def make(**kwargs) -> Engine:
        kwargs.setdefault("n_ctx", 512)
        kwargs.setdefault("n_parallel", 4)
        kwargs.setdefault("n_threads", 1)
        kwargs.setdefault("n_gpu_layers", N_GPU_LAYERS)
        e = Engine(str(demo_model_path), **kwargs)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()
