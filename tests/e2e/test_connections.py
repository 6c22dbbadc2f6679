"""Connections that send nothing: they are bounded, the oldest go first, and everyone else is served."""
from __future__ import annotations

import http.client
import socket

import pytest

# a small worker (12 connections) with smaller idle bounds, so that a few sockets make a flood;
# the first-request time-out is far longer than the test, so whatever closes a socket here is the bound
LIMITS = {"LMSP_GUNICORN_WORKER_CONNECTIONS": "12", "LMSP_MAX_IDLE_CONNECTIONS": "6",
          "LMSP_MAX_IDLE_PER_ADDRESS": "3", "LMSP_HEADER_TIMEOUT": "600"}
WAIT = 15.0  # seconds any one socket operation may take


def idle_socket(port: int, source: str) -> socket.socket:
    """A connection from ``source`` (a loopback address) that sends nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT, source_address=(source, 0))
    sock.settimeout(WAIT)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (waits up to WAIT for it)."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def answers(sock: socket.socket) -> bytes:
    """The status line of a /healthz asked on ``sock``."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: lmsp\r\n\r\n")
    return sock.recv(4096).split(b"\r\n", 1)[0]


def test_a_flood_of_idle_connections_closes_the_oldest_and_others_are_served(make_server):
    server = make_server(env=LIMITS).start()
    token = server.pair()
    flood = {source: [idle_socket(server.port, source) for _ in range(4)]
             for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4")}   # 12: the worker's every connection
    try:
        first = flood["127.0.0.2"]
        # 127.0.0.2's oldest went when its fourth came (3 per address), and the rest of it when
        # the others passed 6 in all; the newest, 127.0.0.4's last 3, wait on
        assert closed_by_server(first[0]), "the oldest idle connection was not closed"
        assert all(closed_by_server(sock) for sock in first[1:]), "idle connections past the total were kept"
        assert closed_by_server(flood["127.0.0.3"][0])
        assert closed_by_server(flood["127.0.0.4"][0])
        assert [answers(sock) for sock in flood["127.0.0.4"][1:]] == [b"HTTP/1.1 200 OK"] * 3
        flood["127.0.0.4"].append(idle_socket(server.port, "127.0.0.4"))
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
        try:
            for path in ("/healthz", "/readyz", "/metrics"):
                conn.request("GET", path)
                response = conn.getresponse()
                response.read()
                assert response.status == 200, path
            conn.request("POST", "/v1/responses", body=b'{"model": "tiny", "input": "Hi", "max_output_tokens": 4}',
                         headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            assert response.status == 200
        except OSError as exc:
            pytest.fail(f"a request during the flood got no answer: {exc!r}\n{server.log()}")
        finally:
            conn.close()
    finally:
        for socks in flood.values():
            for sock in socks:
                sock.close()
    server.check_alive()
