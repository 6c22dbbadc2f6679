"""Fixtures of the store tests: everything goes through the public Store interface."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lmsp.store import Store

# child processes (spawn) import their entry points from this folder
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "lmsp.db"


@pytest.fixture
def store(db_path: Path, clock: Clock):
    s = Store.open(db_path, clock=clock)
    yield s
    s.close()


@pytest.fixture
def make_task(store: Store):
    """Create a task: ``make_task(on_restart="fail", client_id="cli_a", **create_task options)``."""

    def make(on_restart: str = "fail", client_id: str | None = "cli_a", **kw) -> dict:
        kw.setdefault("model", "tiny")
        kw.setdefault("request", {"model": "tiny", "input": "hello", "max_output_tokens": 8, "seed": 1})
        kw.setdefault("background", True)
        kw.setdefault("stream", False)
        return store.create_task(client_id=client_id, on_restart=on_restart, **kw)

    return make


@pytest.fixture
def running_task(store: Store, make_task):
    """A task claimed by worker ``w1`` and running; returns its task id."""

    def make(on_restart: str = "fail", **kw) -> str:
        tid = make_task(on_restart, **kw)["task"]["id"]
        claims = store.claim("w1", limit=100, lease=30)
        assert tid in [c["task_id"] for c in claims]
        store.set_running(tid, "w1")
        return tid

    return make

