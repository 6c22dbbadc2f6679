"""The gunicorn master of ``lmsp serve``: start-up preparation in a child, a small master."""
from __future__ import annotations

import gc
import os
import subprocess

import pytest
from e2e_helpers import lmsp_command


def mapped_files(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as fh:
        return {line.split()[-1] for line in fh if "/" in line}


def test_the_master_holds_no_gevent_sqlite_or_engine(make_server):
    server = make_server().start()
    master = mapped_files(server.proc.pid)
    [worker_pid] = server.workers()
    worker = mapped_files(worker_pid)
    for part in ("gevent", "_sqlite3"):
        assert any(part in path for path in worker), part
    for part in ("gevent", "_sqlite3", "lmsp/_native"):  # the engine loads in the worker, at first use
        assert not any(part in path for path in master), f"{part} is loaded in the master"
    assert "start-up recovery done" in server.log()


def test_the_master_freezes_its_objects_before_each_fork(tmp_path, monkeypatch):
    """So that the worker's collections leave the pages it shares with the master alone
    (2 MB less PSS for the two processes at one client, SmolLM2)."""
    monkeypatch.setenv("LMSP_DATA_DIR", str(tmp_path))
    from lmsp.serving import gunicorn_conf

    gc.unfreeze()
    try:
        gunicorn_conf.pre_fork(None, None)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_what_the_service_writes_is_its_users_alone(make_server):
    """The database holds every client's prompts and answers: not for other local users,
    whatever the umask the service was started with."""
    old = os.umask(0o022)
    try:
        server = make_server().start()
    finally:
        os.umask(old)
    data = server.data_dir
    for path in (data, data / "lmsp.db", data / "lmsp.db-wal", data / "admin.token", data / "models",
                 data / "snapshots", data / "lmsp.lock"):
        assert path.exists() and path.stat().st_mode & 0o077 == 0, (path, oct(path.stat().st_mode))


def test_a_model_that_cannot_be_served_stops_the_start_with_its_reason(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with open(tmp_path / "serve.log", "wb") as log:
        rc = subprocess.run(lmsp_command() + ["serve", "--data-dir", str(tmp_path / "data"), "--bind",
                                              "127.0.0.1:0", "--model", str(bad)],
                            stdout=log, stderr=subprocess.STDOUT, timeout=120).returncode
    text = (tmp_path / "serve.log").read_text()
    assert rc != 0
    assert "lmsp: cannot start: the model" in text and "broken.gguf" in text, text
    assert "Traceback" not in text.split("lmsp: cannot start")[0].splitlines()[-1]


@pytest.mark.slow  # waits out the second master's start
def test_a_second_service_on_the_same_data_directory_refuses_to_start(make_server):
    """Its start-up recovery would fail the first service's running tasks as left over:
    it stops before, with its reason, and the first service's task runs on."""
    from test_crash import LONG, finished

    server = make_server().start()
    token = server.pair()
    created = server.call("POST", "/v1/responses", {**LONG, "on_restart": "fail"}, token=token, expect=202)
    task_id = created["task"]["id"]
    server.wait_task(token, task_id, lambda t: t["status"] == "running")
    with open(server.log_dir / "second.log", "wb") as log:
        rc = subprocess.run(lmsp_command() + ["serve", "--data-dir", str(server.data_dir), "--bind",
                                              "127.0.0.1:0", "--model", str(server.model)],
                            stdout=log, stderr=subprocess.STDOUT, timeout=120,
                            env={**{k: v for k, v in os.environ.items() if not k.startswith("LMSP_")},
                                 **server.env}).returncode
    text = (server.log_dir / "second.log").read_text()
    assert rc != 0 and "another lmsp service uses the data directory" in text, text
    task = server.wait_task(token, task_id, finished)
    assert task["status"] == "completed", task


def test_a_worker_told_to_go_claims_no_more_then_stops(make_server):
    server = make_server().start()
    server.stop()
    log = server.log()
    assert "draining: no more claims" in log, log
    assert log.index("draining: no more claims") < log.index("stopped")
