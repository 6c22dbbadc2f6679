"""Behind a real nginx using the shipped site's proxy settings, a stream arrives event by event."""
from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from e2e_helpers import check_log, deltas, free_port, sse_events

SITE = Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "lmsp.conf"


def shipped_location() -> str:
    """The ``location / { ... }`` block of deploy/nginx/lmsp.conf, as shipped."""
    match = re.search(r"^    location / \{\n.*?^    \}\n", SITE.read_text(), re.S | re.M)
    assert match, f"no 'location /' block in {SITE}"
    return match.group(0)


@pytest.fixture(scope="module")
def nginx(served, tmp_path_factory):
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    assert Path(binary).exists(), "nginx is not installed (scripts/dev test installs it where it can)"
    root = tmp_path_factory.mktemp("nginx")
    port = free_port()
    for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (root / name).mkdir()
    conf = root / "nginx.conf"
    conf.write_text(f"""
daemon off;
master_process on;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log info;
events {{ worker_connections 64; }}
http {{
    access_log {root}/access.log;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    upstream lmsp {{
        server 127.0.0.1:{served.port};
        keepalive 4;
    }}
    server {{
        listen 127.0.0.1:{port};
{shipped_location()}
    }}
}}
""")
    proc = subprocess.Popen([binary, "-p", str(root), "-c", str(conf), "-e", str(root / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            pytest.fail(f"nginx exited ({proc.returncode}):\n{(root / 'error.log').read_text(errors='replace')}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("nginx did not listen")
            time.sleep(0.05)
    yield port
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_events_pass_nginx_before_the_stream_ends(served, served_token, nginx):
    """A waiting task's first events reach the client while the stream stays open: only then does
    the test cancel the task, which ends the stream. A buffering proxy would hold those events
    back, and the read would time out instead."""
    token = served_token
    blocker = served.call("POST", "/v1/responses", {"model": "tiny", "input": "Count:", "background": True,
                                                      "max_output_tokens": 1500}, token=token, expect=202)
    served.wait_task(token, blocker["task"]["id"], lambda t: t["status"] == "running")
    waiting = served.call("POST", "/v1/responses", {"model": "tiny", "input": "Next:", "background": True},
                          token=token, expect=202)  # one engine slot: it stays queued
    seen = []
    for event in sse_events("127.0.0.1", nginx, "GET", f"/v1/responses/{waiting['id']}?stream=true",
                            token=token, timeout=20):
        seen.append(event)
        if event["type"] == "response.queued":
            assert served.call("POST", f"/v1/responses/{waiting['id']}/cancel", token=token)["status"] == "cancelled"
    assert check_log(seen) == ["response.created", "response.queued", "response.cancelled"]
    served.call("POST", f"/v1/responses/{blocker['id']}/cancel", token=token)
    served.wait_task(token, blocker["task"]["id"], lambda t: t["status"] == "cancelled")


def test_a_streamed_response_through_nginx(served, served_token, nginx):
    events = list(sse_events("127.0.0.1", nginx, "POST", "/v1/responses", token=served_token, timeout=60,
                             body={"model": "tiny", "input": "Hello", "max_output_tokens": 16, "stream": True}))
    types = check_log(events)
    assert types[0] == "response.created"
    assert types[-1] in ("response.completed", "response.incomplete")
    assert deltas(events) == events[-1]["response"]["output"][0]["content"][0]["text"]
