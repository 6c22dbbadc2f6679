"""Fixtures of the end-to-end tests: real gunicorn servers on free loopback ports."""
from __future__ import annotations

import pytest
from e2e_helpers import Server


@pytest.fixture
def make_server(tmp_path, demo_model_path):
    """Servers on their own data directories under tmp_path; every one is killed at teardown."""
    made = []

    def make(name: str = "svc", env: dict | None = None) -> Server:
        root = tmp_path / name
        root.mkdir()
        server = Server(root / "data", root, demo_model_path, env)
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop(timeout=10)


@pytest.fixture(scope="module")
def served(tmp_path_factory, demo_model_path):
    """One server for a whole module (one engine slot, so a second task waits in the queue)."""
    root = tmp_path_factory.mktemp("served")
    server = Server(root / "data", root, demo_model_path, {"LMSP_N_PARALLEL": "1"})
    server.start()
    yield server
    server.stop(timeout=10)


@pytest.fixture(scope="module")
def served_token(served):
    return served.pair()
