"""Fixtures of the reliability area: a real ``lmsp serve`` service per test.

The drivers and the invariant checker live in ``bench/reliability/`` (the long
runs use them too); they are put on the import path here.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "reliability"))

from rel_harness import Client, Server  # noqa: E402


@pytest.fixture
def make_server(tmp_path: Path):
    """``make_server(**kw)``: a stopped :class:`Server` on ``tmp_path/data``
    (or ``data_dir=``); every one made is stopped at the end of the test."""
    made: list[Server] = []

    def make(*, data_dir: Path | None = None, env: dict[str, str] | None = None, **kw) -> Server:
        name = f"server{len(made)}"
        server = Server(data_dir or tmp_path / name / "data", log=tmp_path / f"{name}.log", env=env, **kw)
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


@pytest.fixture
def service(make_server) -> Server:
    """A running service with the demo model, default settings."""
    server = make_server()
    server.start()
    return server


@pytest.fixture
def writer(service: Server) -> Client:
    """A paired client that may create and read responses."""
    return service.pair(["responses:write", "responses:read", "models:read"], name="writer")
