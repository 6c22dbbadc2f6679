"""Behind nginx running the whole shipped site (TLS included): a flood of connections that send
nothing leaves the service served, and nginx closes them after the site's client_header_timeout."""
from __future__ import annotations

import http.client
import select
import shutil
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "reliability"))

from rel_harness import free_port, run_nginx, shipped_site, stop_process  # noqa: E402

# the test's nginx.conf (not the site) gives its one worker few connections, so that a few hundred
# idle sockets are more than it holds; the site's client_header_timeout (10 s) is kept as shipped
WORKER_CONNECTIONS = 128
FLOOD = 300
WAIT = 30.0  # seconds a closing may take: the site's 10 s time-out with room; nginx's default is 60 s


@pytest.fixture(scope="module")
def site(served, tmp_path_factory):
    """nginx with deploy/nginx/lmsp.conf whole in front of ``served``: (port, CA file, root)."""
    root = tmp_path_factory.mktemp("nginx-site")
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed: the site's TLS server needs a certificate")
    cert, key = root / "lmsp.pem", root / "lmsp.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=lmsp.example.lan", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    port = free_port()
    try:
        proc = run_nginx(root, shipped_site(port, served.port, cert, key), port, WORKER_CONNECTIONS)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield port, cert, root
    stop_process(proc)


def ask(port: int, cafile: Path, method: str, path: str, token: str | None = None, body: bytes | None = None) -> int:
    """The status of one request over TLS (the certificate checked) on a new connection."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=WAIT,
                                       context=ssl.create_default_context(cafile=str(cafile)))
    headers = {"Content-Type": "application/json"} if body else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def closed_now(sock: socket.socket) -> bool:
    """Whether the peer has closed ``sock`` already (no waiting)."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


def closed_within(sock: socket.socket, deadline: float) -> bool:
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


@pytest.mark.slow  # waits out nginx's 10 s header timeout
def test_a_flood_of_idle_connections_through_the_shipped_site(served, served_token, site):
    port, cafile, root = site
    started = time.monotonic()
    flood = [socket.create_connection(("127.0.0.1", port), timeout=WAIT) for _ in range(FLOOD)]
    try:
        # while the flood lasts: health, readiness, metrics and an authenticated request
        statuses = [ask(port, cafile, "GET", path) for path in ("/healthz", "/readyz", "/metrics")]
        statuses.append(ask(port, cafile, "POST", "/v1/responses", served_token,
                            b'{"model": "tiny", "input": "Hi", "max_output_tokens": 4}'))
        assert statuses == [200, 200, 200, 200]
        # nginx, short of connections, closed the oldest idle ones and holds the newest
        assert not closed_now(flood[-1]), "the newest idle connection is gone: the flood did not last"
        assert closed_now(flood[0]), "the oldest idle connection is still open"
        assert "worker_connections are not enough, reusing connections" in (root / "error.log").read_text()
        # the rest, which never sent a byte, are closed by the site's client_header_timeout
        deadline = started + WAIT
        kept = [sock for sock in flood if not closed_within(sock, deadline)]
        assert kept == [], f"{len(kept)} idle connections still open {WAIT:.0f} s after they were made"
    finally:
        for sock in flood:
            sock.close()
    assert ask(port, cafile, "GET", "/healthz") == 200
    served.check_alive()
