"""Abuse of a running service: tokens, scopes, other clients' ids, model paths,
pairing-code guessing, oversized requests and slow clients."""
from __future__ import annotations

import os
import socket

import pytest

from rel_harness import Client, Server

BG = {"model": "demo", "input": "hello", "max_output_tokens": 4, "background": True, "temperature": 0}


def _raw(server: Server, data: bytes, *, timeout: float = 30.0) -> bytes:
    """Send raw bytes, read until the server closes or answers one response head."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        out = b""
        try:
            while b"\r\n\r\n" not in out:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                out += chunk
        except ConnectionResetError:
            pass
        return out


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One service for the tests of this file that do not change its settings."""
    root = tmp_path_factory.mktemp("security")
    server = Server(root / "data", log=root / "server.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def shared_writer(shared) -> Client:
    return shared.pair(["responses:write", "responses:read"], name="writer")


def _status(head: bytes) -> int | None:
    try:
        return int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


# ---------------------------------------------------------------- tokens

@pytest.mark.parametrize("header", [
    None, "", "Bearer", "Bearer ", "bearer", "Basic dXNlcjpwYXNz", "Bearer a b", "Token abc",
    "Bearer " + "x" * 5000, "Bearer \u00e9\u00e9", "Bearer lmsp_unknown_token_0000000000000000000000",
])
def test_missing_malformed_or_unknown_tokens_are_401(shared, header):
    service = shared
    client = service.anonymous()
    headers = {} if header is None else {"Authorization": header}
    for method, path in (("GET", "/v1/responses"), ("POST", "/v1/responses"), ("GET", "/v1/models"),
                         ("GET", "/v1/clients")):
        try:
            res = client.request(method, path, BG if method == "POST" else None, headers=headers)
        except UnicodeEncodeError:
            # http.client refuses to send non-Latin-1 headers; send them raw instead
            head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {header}\r\n"
                    f"Content-Length: 0\r\nConnection: close\r\n\r\n").encode()
            assert _status(_raw(service, head)) in (400, 401)
            continue
        assert res.status == 401 and res.error_code == "unauthorized", (header, path, res.status, res.body)
        assert res.headers.get("www-authenticate", "").startswith("Bearer"), res.headers


def test_a_revoked_token_stops_working_at_once(shared):
    service = shared
    client = service.pair(["responses:write", "responses:read"])
    assert client.get("/v1/responses").status == 200
    res = service.admin().delete(f"/v1/clients/{client.client_id}")
    assert res.status == 200, res.body
    after = client.get("/v1/responses")
    assert after.status == 401 and after.error_code == "unauthorized"
    assert client.post("/v1/responses", BG).status == 401


# ---------------------------------------------------------------- scopes

def test_scopes_cannot_be_exceeded_or_escalated(shared):
    service = shared
    reader = service.pair(["responses:read"])
    writer = service.pair(["responses:write", "responses:read"])
    res = reader.post("/v1/responses", BG)
    assert res.status == 403 and res.error_code == "insufficient_scope"
    for client in (reader, writer):
        assert client.post("/v1/models", {"path": "demo.gguf"}).status == 403
        assert client.post("/v1/models/demo/unload", {}).status == 403
        assert client.get("/v1/clients").status == 403
        assert client.post("/v1/pairings", {"scopes": ["admin"]}).status == 403
        assert client.delete(f"/v1/clients/{client.client_id}").status == 403
    # a pairing request cannot ask for more than its code grants
    code = service.pairing_code(["responses:read"])
    res = service.anonymous().post("/v1/pair", {"code": code, "client_name": "x", "scopes": ["admin"]})
    assert res.status == 400, res.body
    res = service.anonymous().post("/v1/pair", {"code": code, "client_name": "x"})
    assert res.status == 201 and res.body["scopes"] == ["responses:read"], res.body


# ------------------------------------------------------- other clients' ids

def test_another_clients_responses_and_tasks_are_404(shared):
    service = shared
    alice = service.pair(["responses:write", "responses:read"], name="alice")
    mallory = service.pair(["responses:write", "responses:read"], name="mallory")
    res = alice.post("/v1/responses", BG)
    assert res.status == 202
    rid, tid = res.body["id"], res.body["task"]["id"]
    for method, path in (("GET", f"/v1/responses/{rid}"), ("GET", f"/v1/responses/{rid}?stream=true"),
                         ("POST", f"/v1/responses/{rid}/cancel"), ("DELETE", f"/v1/responses/{rid}"),
                         ("GET", f"/v1/tasks/{tid}"), ("GET", f"/v1/tasks/{tid}/events"),
                         ("POST", f"/v1/tasks/{tid}/cancel")):
        got = mallory.request(method, path, {} if method == "POST" else None)
        assert got.status == 404 and got.error_code == "not_found", (method, path, got.status, got.body)
    listed = mallory.get("/v1/responses").body["data"]
    assert rid not in [r["id"] for r in listed]
    tasks = mallory.get("/v1/tasks").body["data"]
    assert tid not in [t["id"] for t in tasks]
    # the owner still sees it untouched
    mine = alice.get(f"/v1/responses/{rid}")
    assert mine.status == 200 and mine.body["status"] != "cancelled"


# ------------------------------------------------------------- model paths

def test_model_paths_cannot_leave_the_models_directory(shared):
    service = shared
    admin = service.admin()
    models = service.data_dir / "models"
    os.symlink(service.data_dir / "lmsp.db", models / "link.gguf")
    os.symlink("/etc", models / "etc")
    for path in ("../lmsp.db", "../admin.token", "/etc/passwd", "a/../../lmsp.db", "..", ".",
                 "..\\lmsp.db", "models/../../lmsp.db", "link.gguf", "etc/passwd", "demo.gguf\x00.txt",
                 "%2e%2e/lmsp.db", "", "   ", "C:\\Windows\\win.ini", "//etc/passwd"):
        res = admin.post("/v1/models", {"path": path, "id": "escape"})
        assert res.status == 400 and res.error_code == "invalid_request", (path, res.status, res.body)
        assert res.body["error"]["param"] == "path", (path, res.body)
    for bad in (None, 1, ["demo.gguf"], {"a": 1}):
        res = admin.post("/v1/models", {"path": bad})
        assert res.status == 400, (bad, res.body)
    assert admin.get("/v1/models/escape").status == 404


# ---------------------------------------------------------- pairing codes

def test_pairing_code_guessing_is_limited(service):
    anon = service.anonymous()
    statuses = []
    for i in range(20):
        res = anon.post("/v1/pair", {"code": f"WRONG-{i:04d}", "client_name": "guesser"})
        statuses.append(res.status)
        if res.status == 429:
            assert res.error_code == "rate_limited" and int(res.headers["retry-after"]) >= 1
    assert set(statuses) <= {400, 429}, statuses
    assert statuses.count(400) <= 5 and statuses[-1] == 429, statuses


# ------------------------------------------------------ oversized requests

def test_oversized_headers_and_bodies_are_refused_cleanly(shared, shared_writer):
    service, writer = shared, shared_writer
    long_line = b"GET /healthz?" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    assert _status(_raw(service, long_line)) in (400, 414)
    huge_header = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20000 + b"\r\n\r\n"
    assert _status(_raw(service, huge_header)) in (400, 431)
    many = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(500)) + b"\r\n"
    assert _status(_raw(service, many)) in (400, 431)

    big = dict(BG, input="x" * (2 << 20))
    res = writer.post("/v1/responses", big)
    assert res.status == 413 and res.error_code == "payload_too_large", (res.status, res.body)
    # a Content-Length that announces 10 GB is refused without reading it
    head = (f"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {writer.token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n{").encode()
    assert _status(_raw(service, head)) == 413
    # deeply nested JSON is a clean 400, not a crash
    nested = b"[" * 100000 + b"]" * 100000
    res = writer.request("POST", "/v1/responses", raw_body=nested)
    assert res.status in (400, 413), (res.status, res.body)
    service.check_alive()
    assert service.anonymous().get("/healthz").status == 200


# ------------------------------------------------------------ slow clients

@pytest.mark.slow  # a real service, crash or wait: seconds each on 2 cores
def test_slow_clients_are_cut_off_and_do_not_starve_others(make_server):
    server = make_server(env={"LMSP_GUNICORN_KEEPALIVE": "2", "LMSP_HEADER_TIMEOUT": "2"})
    server.start()
    idle = []
    for _ in range(50):   # connections that never send a byte
        idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=30))
    try:
        slow = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        cut = False
        for i in range(60):          # a header line every 0.5 s, for up to 30 s
            # meanwhile a normal client is served
            assert server.anonymous().get("/healthz").status == 200
            try:
                slow.sendall(b"X-Slow-%d: y\r\n" % i)
                slow.settimeout(0.5)
                if slow.recv(1024) == b"":
                    cut = True
                    break
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
        slow.close()
        assert cut, "a client sending its headers one line every 0.5 s was never cut off"
    finally:
        for sock in idle:
            sock.close()
    server.check_alive()


@pytest.mark.slow  # a real service, crash or wait: seconds each on 2 cores
def test_a_body_trickled_byte_by_byte_is_cut_off(make_server):
    """A request head is cut off by header_timeout (above); a body
    sent one byte a second must meet a deadline as well, or a few hundred such
    clients hold every connection of the worker (and nginx passes bodies
    through unbuffered, ``proxy_request_buffering off``, so it does not help)."""
    server = make_server(env={"LMSP_GUNICORN_KEEPALIVE": "2", "LMSP_BODY_TIMEOUT": "2"})
    server.start()
    token = server.admin().token
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    try:
        sock.sendall(f"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode())
        outcome = None
        for _ in range(20):          # one byte a second, for up to 20 s (ten times the setting)
            try:
                sock.sendall(b" ")
                sock.settimeout(1.0)
                answer = sock.recv(4096)
                outcome = "answered" if answer else "closed"
                break
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                outcome = "closed"
                break
        assert outcome is not None, "a body trickled at one byte a second was never cut off"
        if outcome == "answered":
            assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
            sock.settimeout(10)
            while b"request_timeout" not in answer:   # the body may follow the head separately
                more = sock.recv(4096)
                if not more:
                    break
                answer += more
            assert b"request_timeout" in answer, answer[:400]
    finally:
        sock.close()
    server.check_alive()
