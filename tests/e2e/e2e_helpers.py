"""Helpers of the end-to-end tests: a real ``lmsp serve`` (gunicorn) in a subprocess, HTTP and SSE."""
from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from loopback import free_port, lmsp_command  # noqa: F401 (the helpers' users import them from here)

import pytest

FINISHED = ("completed", "failed", "cancelled")
# the stock server settings for these tests: one engine thread (the CI box has
# 2 cores), short leases so that a dead worker's tasks come back quickly
SERVER_ENV = {
    "LMSP_N_THREADS": "1",
    "LMSP_N_CTX": "2048",
    "LMSP_N_PARALLEL": "4",
    "LMSP_LEASE_SECONDS": "2",
    "LMSP_MAX_OUTPUT_TOKENS_CAP": "2000",
    "LMSP_LOG_LEVEL": "info",
    "LMSP_STOP_GRACE_SECONDS": "2",   # a stop at the end of a test waits little for running tasks
}


class Server:
    """``lmsp serve`` in its own process group, with its log in a file under the test's tmp_path.
    ``app``: another WSGI app (``MODULE:FACTORY()``) served instead of the service's, with the
    service's gunicorn configuration, as ``lmsp serve`` runs gunicorn."""

    def __init__(self, data_dir: Path, log_dir: Path, model: Path, env: dict | None = None,
                 app: str | None = None) -> None:
        self.data_dir = data_dir
        self.log_dir = log_dir
        self.model = model
        self.app = app
        self.env = {**SERVER_ENV, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.starts = 0
        self.log_path = log_dir / "server-0.log"

    # life cycle
    def start(self, timeout: float = 90.0) -> "Server":
        assert self.proc is None, "already running"
        self.port = free_port()
        self.starts += 1
        self.log_path = self.log_dir / f"server-{self.starts}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LMSP_")}
        env.update(self.env)
        argv = lmsp_command() + ["serve", "--data-dir", str(self.data_dir), "--bind", f"127.0.0.1:{self.port}",
                                 "--model", str(self.model)]
        if self.app is not None:  # what `lmsp serve` runs, with the app named
            self.data_dir.mkdir(parents=True, exist_ok=True)
            env.update(LMSP_DATA_DIR=str(self.data_dir.resolve()), LMSP_BIND=f"127.0.0.1:{self.port}",
                       LMSP_MODEL=os.path.realpath(self.model))
            argv = [sys.executable, "-m", "gunicorn", "--config", "python:lmsp.serving.gunicorn_conf", self.app]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            try:
                status, _ = self.request("GET", "/readyz", timeout=2.0)
                if status == 200:
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"the server did not get ready in {timeout:.0f} s\n{self.log()}")
            time.sleep(0.1)

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            rc = self.proc.returncode
            self.proc = None
            pytest.fail(f"the server died (exit status {rc})\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL the whole service (master and workers) at once: a crash."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.proc = None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (graceful), then SIGKILL what is left."""
        if self.proc is None:
            return
        try:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # any worker left behind
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.proc = None

    def workers(self) -> list[int]:
        """The pids of the master's children (the gunicorn workers)."""
        assert self.proc is not None
        children = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.proc.pid and fields[0] != "Z":
                children.append(int(entry))
        return children

    def log(self, tail: int = 12000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no server log)"
        return f"--- {self.log_path} ---\n" + text[-tail:]

    # HTTP
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, method: str, path: str, body=None, *, token: str | None = None, headers=None,
                timeout: float = 30.0, port: int | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", port or self.port, timeout=timeout)
        try:
            hdrs = dict(headers or {})
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                hdrs["Content-Type"] = "application/json"
            if token:
                hdrs["Authorization"] = f"Bearer {token}"
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            raw = resp.read()
            try:
                payload = json.loads(raw) if raw else None
            except ValueError:
                payload = raw.decode(errors="replace")
            return resp.status, payload
        finally:
            conn.close()

    def call(self, method: str, path: str, body=None, *, token: str | None = None, expect: int = 200, **kw):
        status, payload = self.request(method, path, body, token=token, **kw)
        if status != expect:
            pytest.fail(f"{method} {path} answered {status} (expected {expect}): {payload}\n{self.log()}")
        return payload

    # the operator's and the client's side
    def operator(self, *args: str) -> dict:
        out = subprocess.run(lmsp_command() + [*args, "--data-dir", str(self.data_dir), "--json"],
                             capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if not k.startswith("LMSP_")})
        if out.returncode != 0:
            pytest.fail(f"lmsp {' '.join(args)} failed ({out.returncode}): {out.stdout}{out.stderr}")
        return json.loads(out.stdout)

    def pair(self, scopes: str = "responses:write,responses:read,models:read", name: str = "e2e") -> str:
        """A client token: ``lmsp pair --json`` on the box, then ``POST /v1/pair``."""
        code = self.operator("pair", "--scopes", scopes)["code"]
        return self.call("POST", "/v1/pair", {"code": code, "client_name": name}, expect=201)["token"]

    def wait_task(self, token: str, task_id: str, predicate, timeout: float = 90.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            task = self.call("GET", f"/v1/tasks/{task_id}", token=token)
            if predicate(task):
                return task
            if time.monotonic() > deadline:
                pytest.fail(f"task {task_id} stuck: {task}\n{self.log()}")
            time.sleep(0.05)

    def events(self, token: str, task_id: str) -> list[dict]:
        out, after = [], 0
        while True:
            page = self.call("GET", f"/v1/tasks/{task_id}/events?after={after}", token=token)
            out.extend(page["data"])
            if not page["has_more"]:
                return out
            after = out[-1]["sequence_number"]


def sse_events(host: str, port: int, method: str, path: str, *, token: str, body=None, timeout: float = 30.0):
    """Yield the events of an SSE answer one by one as they arrive (a blocked read fails after timeout)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    try:
        assert resp.status == 200, (resp.status, resp.read())
        assert resp.getheader("Content-Type", "").startswith("text/event-stream")
        fields: dict = {}
        while True:
            line = resp.readline()
            if not line:
                return
            line = line.decode().rstrip("\r\n")
            if line == "":
                if "data" in fields:
                    yield json.loads(fields["data"])
                fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value[1:] if value.startswith(" ") else value
    finally:
        conn.close()


def deltas(events) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def check_log(events) -> list[str]:
    """A task's whole log: numbered 1, 2, 3... with no gap."""
    seqs = [e["sequence_number"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    return [e["type"] for e in events]


def check_stream(events) -> list[str]:
    """A response stream: the log's numbers, increasing, with gaps where the log has
    a task.* event, which the stream leaves out."""
    seqs = [e["sequence_number"] for e in events]
    assert seqs == sorted(set(seqs)) and (not seqs or seqs[0] == 1), seqs
    types = [e["type"] for e in events]
    assert not [t for t in types if t.startswith("task.")], types
    return types


def response_events(log) -> list[dict]:
    """The events of a task's log that its response stream shows."""
    return [e for e in log if not e["type"].startswith("task.")]


# background tasks killed mid-generation (test_crash.py, test_real_model.py)
def start_running(server: Server, token: str, body: dict, policies, min_sequence: int = 10) -> dict[str, str]:
    """One background task of ``body`` per restart policy; returns each policy's task id
    once every task runs with at least ``min_sequence`` events committed."""
    tasks = {}
    for policy in policies:
        created = server.call("POST", "/v1/responses", {**body, "background": True, "on_restart": policy},
                              token=token, expect=202)
        assert created["status"] == "queued"
        tasks[policy] = created["task"]["id"]
    for task_id in tasks.values():
        server.wait_task(token, task_id,
                         lambda t: t["status"] == "running" and t["last_sequence_number"] >= min_sequence)
    return tasks


def uninterrupted_text(server: Server, token: str, body: dict) -> str:
    """The answer of an uninterrupted background run of ``body`` (greedy: the same every time)."""
    created = server.call("POST", "/v1/responses", {**body, "background": True, "on_restart": "fail"},
                          token=token, expect=202)
    server.wait_task(token, created["task"]["id"], lambda t: t["status"] in FINISHED, timeout=180)
    return server.call("GET", f"/v1/responses/{created['id']}", token=token)["output"][0]["content"][0]["text"]


def resumed_text(server: Server, token: str, task_id: str, before: str) -> str:
    """The text of a ``resume`` task that a restart continued; checks that it completed on
    its second attempt, that its log says so once and that its deltas lose and repeat nothing."""
    task = server.wait_task(token, task_id, lambda t: t["status"] in FINISHED, timeout=180)
    assert task["status"] == "completed", (task, server.log())
    assert task["attempts"] == 2
    events = server.events(token, task_id)
    types = check_log(events)
    assert types.count("task.resumed") == 1
    assert types.count("response.output_item.added") == 1
    response = server.call("GET", f"/v1/responses/{task['response_id']}", token=token)
    text = response["output"][0]["content"][0]["text"]
    assert deltas(events) == text
    assert text.startswith(before)
    return text
