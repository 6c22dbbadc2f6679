"""Corrupt and hostile GGUF files: a clean error, never a crash.

Two paths are fuzzed with the same files: ``lmsp.native.read_gguf_info`` (run
in a child process, so that a crash fails one example instead of the test
run) and ``POST /v1/models`` on a running service, whose worker must survive
every file (same pid before and after, no restart by gunicorn).
"""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from rel_gguf import CORRUPTIONS, ReaderChild, hostile_gguf, valid_spec
from rel_harness import Server

# accepted by the header reader on purpose: a context length is metadata, and a
# count of the wrong type reads as absent (the engine refuses the file at load)
ACCEPTED = {"context_length_absurd", "block_count_strings", "head_count_floats"}


@pytest.fixture(scope="module")
def reader():
    child = ReaderChild()
    yield child
    child.close()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gguf")


def _assert_clean(result: dict, what: str) -> None:
    """No crash: the reader answered, with its info or a Python exception that has a message."""
    assert "crashed" not in result, f"read_gguf_info crashed on {what}: {result}"
    if not result["ok"]:
        assert result["message"].strip(), f"{what}: an error without a message"


def test_the_valid_base_file_is_read(reader, scratch):
    """The corruptions start from a file the reader accepts: their rejection is not trivial."""
    path = scratch / "valid.gguf"
    path.write_bytes(valid_spec().encode())
    result = reader.read(str(path))
    assert result.get("ok") is True, result


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_named_corruption_is_a_clean_format_error(reader, scratch, name):
    path = scratch / f"{name}.gguf"
    path.write_bytes(CORRUPTIONS[name]())
    result = reader.read(str(path))
    _assert_clean(result, name)
    if name not in ACCEPTED:
        # the documented error (csrc/gguf_info.h): ModelFormatError, naming the file
        assert result["ok"] is False and result["type"] == "ModelFormatError", result
        assert str(path) in result["message"], result


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=hostile_gguf())
def test_generated_headers_never_crash_the_reader(reader, scratch, data):
    path = scratch / "generated.gguf"
    path.write_bytes(data)
    _assert_clean(reader.read(str(path)), f"{len(data)} bytes starting {data[:32]!r}")


# ------------------------------------------------------------ through the API

@pytest.fixture(scope="module")
def models_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-server")
    server = Server(root / "data", log=root / "server.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def registrar(models_server):
    return models_server.pair(["models:write", "models:read"], name="registrar")


_counter = itertools.count()


def _register(server: Server, client, data: bytes, label: str) -> str | None:
    """Register a hostile file; what went wrong, or None."""
    name = f"hostile-{next(_counter)}.gguf"
    (server.data_dir / "models" / name).write_bytes(data)
    res = client.post("/v1/models", {"path": name})
    if res.status == 201:
        # the header passed: loading it must fail cleanly too (it is no real model)
        model_id = res.body["id"]
        load = client.post(f"/v1/models/{model_id}/load", {})
        client.delete(f"/v1/models/{model_id}")
        if load.status >= 500:
            return f"{label}: load answered {load.status} {load.body}"
        if load.status == 200 and load.body.get("state") == "loaded":
            return f"{label}: a hostile file was loaded"
        return None
    if res.status != 400 or res.error_code != "invalid_request":
        return f"{label}: register answered {res.status} {res.body}"
    if res.body["error"]["param"] != "path" or not res.body["error"]["message"]:
        return f"{label}: unclear error {res.body}"
    return None


def test_registration_refuses_every_named_corruption_and_the_worker_survives(models_server, registrar):
    workers = models_server.worker_pids()
    problems = [p for name in sorted(CORRUPTIONS)
                if (p := _register(models_server, registrar, CORRUPTIONS[name](), name))]
    models_server.check_alive()
    assert models_server.worker_pids() == workers, "a worker died and was replaced"
    assert models_server.anonymous().get("/healthz").status == 200
    assert problems == []


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=hostile_gguf())
def test_registration_of_generated_files_never_crashes_the_server(models_server, registrar, data):
    workers = models_server.worker_pids()
    problem = _register(models_server, registrar, data, f"{len(data)} bytes starting {data[:32]!r}")
    models_server.check_alive()
    assert models_server.worker_pids() == workers, "a worker died and was replaced"
    assert problem is None, problem
