"""A data directory on a small file system that fills up for a while: what was
accepted with 202 still runs once space is back (nothing fails for it)."""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import time

import pytest
from e2e_helpers import FINISHED, Server

SPELL_SECONDS = 8.0        # how long the disk stays full (longer than a start's tries took to give up)
MODEL_PADDING = 256 << 20  # a sparse tail that makes the model's digest check last about a second


@pytest.fixture
def small_disk(tmp_path):
    """A 40 MB tmpfs mounted for the test. Mounting needs root; without it the
    test fails with the reason, as the tests do whose tools are missing (README)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a small file system here (needs root): {done.stderr.strip() or done.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def fill(directory) -> int:
    """Write zeros into ``directory/filler`` until the file system is full; the bytes written."""
    written = 0
    block = b"\0" * (1 << 20)
    with open(directory / "filler", "wb", buffering=0) as fh:
        while True:
            try:
                written += fh.write(block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
        while True:  # the last partial megabyte
            try:
                if not fh.write(b"\0" * 4096):
                    break
            except OSError:
                break
    return written


def _children(pid: int) -> list[int]:
    """Every process below ``pid`` (the gunicorn master's workers)."""
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        children = [int(child) for child in fh.read().split()]
    return children + [grandchild for child in children for grandchild in _children(child)]


@pytest.mark.slow  # the disk stays full for 8 s
def test_tasks_accepted_before_the_disk_filled_run_once_it_has_room(small_disk, tmp_path, demo_model_path):
    model = tmp_path / "padded.gguf"
    shutil.copyfile(demo_model_path, model)
    os.truncate(model, MODEL_PADDING)  # a valid GGUF file, with a hole after its tensors
    server = Server(small_disk / "data", tmp_path, model, {"LMSP_N_PARALLEL": "4"})
    server.start()
    try:
        token = server.pair()
        task_ids = []
        for i, policy in enumerate(["fail", "retry", "resume"] * 2):
            body = {"model": "padded", "input": f"story {i}", "background": True, "temperature": 0,
                    "max_output_tokens": 8, "on_restart": policy}
            task_ids.append(server.call("POST", "/v1/responses", body, token=token, expect=202)["task"]["id"])
        # the first tasks are claimed; the worker is held still while the disk fills, so
        # that however busy the machine, their starts come when it is full
        server.wait_task(token, task_ids[0], lambda t: t["status"] != "queued")
        workers = _children(server.proc.pid)
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        try:
            assert fill(small_disk) > 0
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
        time.sleep(SPELL_SECONDS)  # the disk stays full this long: the claimed tasks cannot start
        server.check_alive()
        os.unlink(small_disk / "filler")
        tasks = [server.wait_task(token, task_id, lambda t: t["status"] in FINISHED) for task_id in task_ids]
        assert [t["status"] for t in tasks] == ["completed"] * 6, [t.get("error") for t in tasks]
        assert "waits for the store" in server.log(tail=1 << 20)
    finally:
        server.stop(timeout=10)
