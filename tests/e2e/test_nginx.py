"""Behind a real nginx using the shipped site's locations: a stream arrives event by event, and
/metrics stays on the machine."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from e2e_helpers import check_stream, deltas, sse_events

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "reliability"))

from rel_harness import NGINX_SITE, start_nginx, stop_process  # noqa: E402


@pytest.fixture(scope="module")
def nginx(served, tmp_path_factory):
    try:
        proc, port = start_nginx(tmp_path_factory.mktemp("nginx"), served.port, connections=64, keepalive=4)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield port
    stop_process(proc)


def test_events_pass_nginx_before_the_stream_ends(served, served_token, nginx):
    """A waiting task's first events reach the client while the stream stays open: only then does
    the test cancel the task, which ends the stream. A buffering proxy would hold those events
    back, and the read would time out instead."""
    token = served_token
    blocker = served.call("POST", "/v1/responses", {"model": "tiny", "input": "Count on:", "background": True,
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
    assert check_stream(seen) == ["response.created", "response.queued", "response.cancelled"]
    served.call("POST", f"/v1/responses/{blocker['id']}/cancel", token=token)
    served.wait_task(token, blocker["task"]["id"], lambda t: t["status"] == "cancelled")


def test_a_streamed_response_through_nginx(served, served_token, nginx):
    events = list(sse_events("127.0.0.1", nginx, "POST", "/v1/responses", token=served_token, timeout=60,
                             body={"model": "tiny", "input": "Hello", "max_output_tokens": 16, "stream": True}))
    types = check_stream(events)
    assert types[0] == "response.created"
    assert types[-1] in ("response.completed", "response.incomplete")
    assert deltas(events) == events[-1]["response"]["output"][0]["content"][0]["text"]


@pytest.mark.parametrize("path", ["/metrics", "/metrics/"])
def test_metrics_stay_on_the_machine(nginx, path):
    """The shipped site serves /metrics to 127.0.0.1 only, with or without the trailing
    slash the service ignores; 127.0.0.2 stands for any other address."""
    import http.client

    def status(source: str) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", nginx, timeout=30, source_address=(source, 0))
        try:
            conn.request("GET", path)
            return conn.getresponse().status
        finally:
            conn.close()

    assert status("127.0.0.1") == 200
    assert status("127.0.0.2") == 403


def test_the_shipped_site_passes_nginx_t(tmp_path):
    """The whole site as shipped, but for its certificate's paths, is accepted by the nginx
    installed (Debian 12's 1.22 knows no "http2 on;")."""
    import shutil
    import subprocess

    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        pytest.fail("nginx is not installed (scripts/dev test installs it where it can)")
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed: the site's TLS lines need a certificate to be checked with")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=lmsp.example.lan", "-keyout", str(tmp_path / "lmsp.key"), "-out", str(tmp_path / "lmsp.pem")],
                   check=True, capture_output=True)
    site = NGINX_SITE.read_text().replace("/etc/ssl/certs/lmsp.pem", str(tmp_path / "lmsp.pem"))
    (tmp_path / "site.conf").write_text(site.replace("/etc/ssl/private/lmsp.key", str(tmp_path / "lmsp.key")))
    (tmp_path / "nginx.conf").write_text(f"""
pid {tmp_path}/nginx.pid;
error_log {tmp_path}/error.log;
events {{}}
http {{
    access_log off;
    client_body_temp_path {tmp_path};
    proxy_temp_path {tmp_path};
    include {tmp_path}/site.conf;
}}
""")
    done = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"),
                           "-e", str(tmp_path / "error.log")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
