"""Fixtures for the runtime tests: a real store, the real engine, the tiny demo model."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from lmsp import config as config_mod
from lmsp.native import Engine
from lmsp.runtime import Runtime, open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chat_templates import TOOLS_TEMPLATE, template_engine  # noqa: E402


@pytest.fixture(scope="module")
def tools_engine(tmp_path_factory):
    """An engine on a demo model whose template knows tools (the chat layer's)."""
    yield from template_engine(tmp_path_factory, TOOLS_TEMPLATE)


@pytest.fixture(scope="module")
def plain_engine(demo_model_path):
    """An engine on the demo model, whose template knows no tools."""
    e = Engine(str(demo_model_path), n_ctx=1024, n_parallel=1, n_threads=1)
    yield e
    e.close()


@pytest.fixture
def config(tmp_path):
    cfg = config_mod.load(env={}, data_dir=str(tmp_path / "data"), n_ctx=2048, n_parallel=4, n_threads=1,
                          lease_seconds=1.0, max_output_tokens=16)
    cfg.models_dir.mkdir(parents=True)
    cfg.snapshots_dir.mkdir(parents=True)
    return cfg


@pytest.fixture
def store(config):
    s = open_store(config)
    yield s
    s.close()


@pytest.fixture
def model_file(config, demo_model_path):
    """The demo model copied into the models directory as ``tiny.gguf``."""
    return shutil.copyfile(demo_model_path, config.models_dir / "tiny.gguf")


@pytest.fixture
def make_runtime(config):
    """Runtimes started on a store (start-up preparation left to the test); all stopped at teardown."""
    made = []

    def make(store, *, start=True, **kwargs):
        kwargs.setdefault("prepare", False)
        rt = Runtime(kwargs.pop("config", config), store, **kwargs)
        made.append(rt)
        if start:
            rt.start()
        return rt

    yield make
    for rt in made:
        rt.stop(timeout=5.0)


@pytest.fixture
def runtime(make_runtime, store, model_file):
    rt = make_runtime(store)
    rt.register_model("tiny.gguf")
    return rt
