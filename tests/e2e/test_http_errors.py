"""What gunicorn answers itself, under ``lmsp serve``: a request it cannot parse,
one over its limits, a body it cannot decode, an exception that escapes the app.
Each gets the JSON error body of LMSP B.1 (never gunicorn's HTML page, never a
traceback), with the status gunicorn chose, and the connection closes."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from e2e_helpers import Server
from faulty_app import FAULT_PATH, SECRET

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def faulty(tmp_path_factory, demo_model_path):
    """The service with its real app, but for one planted fault (tests/e2e/faulty_app.py)."""
    root = tmp_path_factory.mktemp("http-errors")
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    server = Server(root / "data", root, demo_model_path, {"PYTHONPATH": path}, app="faulty_app:get_app()")
    server.start()
    yield server
    server.stop(timeout=10)


def exchange(server: Server, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``raw`` as is; read the answer to the end of the connection, which the
    server must close (else the socket's timeout fails the test)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        sock.sendall(raw)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, sep, body = data.partition(b"\r\n\r\n")
    assert sep, data[:500]
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, status, _ = status_line.split(" ", 2)
    assert version == "HTTP/1.1", status_line
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    assert int(headers["content-length"]) == len(body), (headers, body)  # one response, nothing after it
    return int(status), headers, body


def assert_error(answer, status: int, code: str, *, mentions: str = "") -> dict:
    got, headers, body = answer
    assert got == status, (got, body)
    assert headers["content-type"] == "application/json", headers
    assert headers["connection"].lower() == "close", headers
    assert headers.get("x-request-id", "").startswith("req_"), headers
    assert not body.lstrip().startswith(b"<"), body
    payload = json.loads(body)
    assert set(payload) == {"error"} and set(payload["error"]) == {"code", "message", "param"}, payload
    error = payload["error"]
    assert error["code"] == code and error["param"] is None, error
    assert isinstance(error["message"], str) and 0 < len(error["message"]) <= 200, error
    assert mentions.lower() in error["message"].lower(), error
    return error


HOST = b"Host: localhost\r\n"

REFUSED = [
    pytest.param(b"POST /v1/responses HTTP/1.1\r\n" + HOST + b"Content-Length: abc\r\n\r\n",
                 400, "invalid_request", "Content-Length", id="content-length-not-a-number"),
    pytest.param(b"GARBAGE\r\n\r\n", 400, "invalid_request", "request line", id="bad-request-line"),
    pytest.param(b"G(T /healthz HTTP/1.1\r\n" + HOST + b"\r\n", 400, "invalid_request", "method",
                 id="bad-method"),
    pytest.param(b"GET /healthz HTTP/2.7\r\n" + HOST + b"\r\n", 400, "invalid_request", "HTTP version",
                 id="unsupported-http-version"),
    pytest.param(b"GET /healthz HTTP/1.1\r\n" + HOST + b"Bad Name: x\r\n\r\n", 400, "invalid_request",
                 "header", id="bad-header-name"),
    pytest.param(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n" + HOST + b"\r\n", 414, "uri_too_long",
                 "request line", id="request-line-too-long"),
    pytest.param(b"GET /healthz HTTP/1.1\r\n" + HOST + b"".join(b"X-H%d: v\r\n" % i for i in range(150)) + b"\r\n",
                 431, "headers_too_large", "header fields", id="too-many-header-fields"),
    pytest.param(b"GET /healthz HTTP/1.1\r\n" + HOST + b"X-Big: " + b"v" * 9000 + b"\r\n\r\n",
                 431, "headers_too_large", "header field", id="header-field-too-long"),
    pytest.param(b"POST /v1/pair HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: foo\r\n\r\n",
                 501, "not_implemented", "transfer coding", id="unknown-transfer-coding"),
    pytest.param(b"POST /v1/pair HTTP/1.1\r\n" + HOST + b"Content-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
                 400, "invalid_request", "chunked", id="bad-chunk-size"),
]


@pytest.mark.parametrize("raw, status, code, mentions", REFUSED)
def test_a_request_the_server_refuses_gets_a_json_error(faulty, raw, status, code, mentions):
    error = assert_error(exchange(faulty, raw), status, code, mentions=mentions)
    assert "aaaaaaaaaa" not in error["message"] and "vvvvvvvvvv" not in error["message"], error
    assert "request id" not in error["message"], error  # a refusal, not a fault of the server's


@pytest.mark.parametrize("path", [FAULT_PATH, FAULT_PATH + "/body"])
def test_an_exception_that_escapes_the_app_is_a_json_500_without_its_details(faulty, path):
    answer = exchange(faulty, f"GET {path} HTTP/1.1\r\n".encode() + HOST + b"\r\n")
    error = assert_error(answer, 500, "internal_error")
    rid = answer[1]["x-request-id"]
    assert error["message"] == f"internal error (request id {rid})", error
    assert SECRET.encode() not in answer[2] and b"Traceback" not in answer[2]
    log = faulty.log(tail=200000)
    assert SECRET in log and rid in log  # the traceback goes to the log, under the request id


def test_the_service_serves_on_after_refusals(faulty):
    exchange(faulty, b"GARBAGE\r\n\r\n")
    status, payload = faulty.request("GET", "/healthz")
    assert (status, payload) == (200, {"status": "ok"})
    faulty.check_alive()
