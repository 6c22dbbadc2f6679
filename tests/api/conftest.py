"""Fixtures of the API tests: the real store in ``tmp_path`` and the app over it."""
from __future__ import annotations

import time

import api_helpers
import pytest
from api_fakes import ScriptedRuntime
from api_helpers import Api, make_client
from open_responses import CheckedApp, Conformance

from lmsp.app import create_app
from lmsp.config import Config
from lmsp.store import Store

MODEL = {"id": "tiny", "path": "tiny.gguf", "digest": "sha256:" + "0" * 64, "size_bytes": 1234,
         "format": "gguf", "architecture": "llama", "parameters": 1000, "quantization": "F32",
         "context_length": 256, "state": "available", "has_chat_template": True}


@pytest.fixture(autouse=True)
def open_responses_conformance():
    """Every Response object and response event an API test gets, through any Api,
    validates against Open Responses (open_responses.py)."""
    conformance = Conformance()
    api_helpers.ANSWER_CHECKS.append(conformance.check)
    yield conformance
    api_helpers.ANSWER_CHECKS.remove(conformance.check)


@pytest.fixture
def config(tmp_path) -> Config:
    return Config(data_dir=tmp_path, heartbeat_seconds=0.05, pairing_max_attempts=3,
                  max_body_bytes=64 * 1024, max_output_tokens=16, max_output_tokens_cap=64,
                  n_ctx=256, n_parallel=2, lease_seconds=5.0).validated()


class Clock:
    """Real time plus an offset that a test can move forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(config, clock):
    store = Store.open(config.db_path, durability="off", clock=clock)
    yield store
    store.close()


@pytest.fixture
def scripted(store) -> ScriptedRuntime:
    store.put_model(MODEL)
    return ScriptedRuntime(store)


@pytest.fixture
def app(config, store, scripted, clock, open_responses_conformance):
    """The app, its answers checked as they are sent (open_responses.py): also those of
    tests that call it without an Api."""
    return CheckedApp(create_app(config, store, scripted, clock=clock, random_seed=lambda: 1234),
                      open_responses_conformance)


@pytest.fixture
def admin(store, app) -> Api:
    return Api(app, make_client(store, ["admin"], "admin")[1])


@pytest.fixture
def user(store, app) -> Api:
    """A client with the usual scopes of a paired application."""
    return Api(app, make_client(store, ["responses:write", "responses:read", "models:read"], "user")[1])


@pytest.fixture
def other(store, app) -> Api:
    """A second ordinary client (isolation tests)."""
    return Api(app, make_client(store, ["responses:write", "responses:read", "models:read"], "other")[1])


@pytest.fixture
def anon(app) -> Api:
    return Api(app)
