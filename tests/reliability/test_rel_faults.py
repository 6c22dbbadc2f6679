"""Faults under a running service: a locked database, a full disk, model files
changed under a registered model.

The disk is really full: the data directory is a small tmpfs mounted for the
test (CI runs as root), not a page limit inside SQLite.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rel_checker import FINISHED, StoreView, check_log, integrity, open_live
from rel_harness import Server

BG = {"model": "demo", "input": "Say something.", "max_output_tokens": 4, "background": True,
      "temperature": 0}

_LOCKER = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE service_config SET value = value WHERE 0")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


def _wait_finished(server: Server, response_ids: list[str], timeout: float = 120.0) -> StoreView:
    deadline = time.monotonic() + timeout
    while True:
        server.check_alive()
        conn = open_live(server.data_dir)
        view = StoreView.load(conn)
        conn.close()
        tasks = [view.by_response(r) for r in response_ids]
        if all(t is not None and t.status in FINISHED for t in tasks):
            return view
        if time.monotonic() > deadline:
            raise AssertionError("tasks never finished: "
                                 + ", ".join(f"{t.id}={t.status}" for t in tasks if t and t.status not in FINISHED))
        time.sleep(0.1)


# ------------------------------------------------------------------ locked

@pytest.mark.slow  # a real service, crash or wait: seconds each on 2 cores
def test_database_locked_past_the_busy_timeout_gives_503_and_the_worker_keeps_serving(make_server):
    server = make_server(env={"LMSP_BUSY_TIMEOUT": "5"})
    server.start()
    client = server.pair(["responses:write", "responses:read"])
    workers = server.worker_pids()
    locker = subprocess.Popen([sys.executable, "-c", _LOCKER, str(server.data_dir / "lmsp.db")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout.readline().strip() == "locked"
        order: list[str] = []
        results = {}

        def write() -> None:
            results["write"] = client.post("/v1/responses", BG, headers={"Idempotency-Key": "locked-1"})
            order.append("write")

        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(0.3)   # let the write reach the lock (the order below is what is checked)
        health = server.anonymous().get("/healthz")
        order.append("healthz")
        listing = client.get("/v1/responses")   # a read needs no write lock in WAL mode
        order.append("read")
        writer.join(60)
        assert not writer.is_alive()
    finally:
        locker.stdin.write("\n")
        locker.stdin.close()
        locker.wait(30)
        locker.stdout.close()
    res = results["write"]
    assert res.status == 503 and res.error_code == "unavailable", (res.status, res.body)
    assert int(res.headers["retry-after"]) >= 1
    assert health.status == 200 and listing.status == 200
    # the worker was not blocked while the write waited for the lock
    assert order.index("healthz") < order.index("write") and order.index("read") < order.index("write"), order
    # nothing was recorded for the refused request: its retry goes through, once
    again = client.post("/v1/responses", BG, headers={"Idempotency-Key": "locked-1"})
    assert again.status == 202, again.body
    replay = client.post("/v1/responses", BG, headers={"Idempotency-Key": "locked-1"})
    assert replay.status == 202 and replay.body["id"] == again.body["id"]
    assert server.worker_pids() == workers
    view = _wait_finished(server, [again.body["id"]])
    assert check_log(view) == []


# ---------------------------------------------------------------- disk full

@pytest.fixture
def small_fs(tmp_path):
    """A 12 MiB tmpfs: really full when filled."""
    mnt = tmp_path / "small-fs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m,mode=0700", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    assert done.returncode == 0, f"mounting a tmpfs failed (the test needs root): {done.stderr}"
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(directory: Path) -> Path:
    """Write zeros until the file system is full (big blocks, then small ones)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 65536, 4096, 512, 1):
            block = b"\0" * size
            try:
                while True:
                    os.write(fd, block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def test_disk_full_gives_503_corrupts_nothing_and_recovers_by_itself(make_server, small_fs, demo_model_path):
    # the model lives elsewhere; one client fills the disk with tasks, past any per-client cap
    server = make_server(data_dir=small_fs / "data", model=demo_model_path,
                         env={"LMSP_MAX_UNFINISHED_PER_CLIENT": "0"})
    server.start()
    body = dict(BG, model="tiny")
    client = server.pair(["responses:write", "responses:read"])
    workers = server.worker_pids()
    accepted = []
    first = client.post("/v1/responses", body)
    assert first.status == 202, first.body
    accepted.append(first.body["id"])
    # a task that is still generating (committing its events) when the disk fills
    long = client.post("/v1/responses", dict(body, max_output_tokens=400))
    assert long.status == 202, long.body
    accepted.append(long.body["id"])
    for _ in range(1200):            # up to a minute
        server.check_alive()
        conn = open_live(server.data_dir)
        task = StoreView.load(conn).by_response(long.body["id"])
        conn.close()
        if task.status == "running" and task.last_seq > 8 or task.status in FINISHED:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the long task never started: {task.status}")

    filler = _fill(small_fs)
    statuses = []
    for i in range(300):
        res = client.post("/v1/responses", body, headers={"Idempotency-Key": f"full-{i}"})
        statuses.append(res.status)
        assert res.status in (202, 503), (res.status, res.body)
        if res.status == 202:
            accepted.append(res.body["id"])
        else:
            assert res.error_code == "unavailable" and int(res.headers["retry-after"]) >= 1
            break
    assert statuses[-1] == 503, f"the full disk was never noticed in {len(statuses)} writes"
    assert client.get("/v1/responses").status == 200          # reads still work
    assert server.anonymous().get("/healthz").status == 200

    filler.unlink()                                           # space returns
    for _ in range(100):
        res = client.post("/v1/responses", body, headers={"Idempotency-Key": "after-full"})
        if res.status != 503:
            break
        time.sleep(0.1)
    assert res.status == 202, (res.status, res.body)
    accepted.append(res.body["id"])
    view = _wait_finished(server, accepted)
    assert check_log(view) == []
    conn = open_live(server.data_dir)
    assert integrity(conn) == []
    conn.close()
    assert server.worker_pids() == workers
    for rid in accepted:                                      # every 202 is there, and finished
        assert view.by_response(rid) is not None


# ------------------------------------------------------------- model files

def _doctor(server: Server) -> tuple[int, dict]:
    done = server.cli("doctor", "--data-dir", str(server.data_dir), "--json")
    return done.returncode, json.loads(done.stdout)


def test_changed_truncated_or_deleted_model_files_are_refused_and_doctor_reports_them(service, writer):
    admin = service.admin()
    models = service.data_dir / "models"
    for name in ("changed", "truncated", "deleted"):
        shutil.copyfile(models / "demo.gguf", models / f"{name}.gguf")
        res = admin.post("/v1/models", {"path": f"{name}.gguf"})
        assert res.status == 201, res.body
    code, report = _doctor(service)
    assert code == 0 and report["ok"] is True, report

    with (models / "changed.gguf").open("r+b") as fh:                 # same size, one byte differs
        fh.seek(-100, os.SEEK_END)
        byte = fh.read(1)
        fh.seek(-100, os.SEEK_END)
        fh.write(bytes([byte[0] ^ 0xFF]))
    size = (models / "truncated.gguf").stat().st_size
    os.truncate(models / "truncated.gguf", size // 2)
    (models / "deleted.gguf").unlink()

    for name in ("changed", "truncated", "deleted"):
        load = admin.post(f"/v1/models/{name}/load", {})
        assert 400 <= load.status < 500 and load.error_code, (name, load.status, load.body)
        assert name in load.body["error"]["message"], load.body
        got = admin.get(f"/v1/models/{name}")
        assert got.status == 200 and got.body["state"] in ("changed", "missing", "failed"), (name, got.body)
        # never served: refused at once, or a task that fails
        plain = writer.post("/v1/responses", {"model": name, "input": "hi", "max_output_tokens": 4})
        assert plain.status < 500, (name, plain.status, plain.body)
        if plain.status == 200:
            assert plain.body["status"] == "failed", (name, plain.body)
        else:
            assert 400 <= plain.status < 500 and plain.error_code, (name, plain.body)
    code, report = _doctor(service)
    assert code == 1 and report["ok"] is False
    status = {m["id"]: m["status"] for m in report["models"]}
    assert status == {"demo": "ok", "changed": "changed", "truncated": "changed", "deleted": "missing"}, status
    service.check_alive()
    # the demo model still serves
    ok = writer.post("/v1/responses", {"model": "demo", "input": "hi", "max_output_tokens": 4})
    assert ok.status == 200 and ok.body["status"] in ("completed", "incomplete"), ok.body
