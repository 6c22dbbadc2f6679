"""Under gevent (as in a gunicorn gevent worker) a request waiting for its task
or following a stream blocks nothing else, and a cancel ends both."""
from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

SOCKET_GUARD = 60.0  # seconds before a hung request fails the test (never reached when it works)


@pytest.fixture
def server(tmp_path):
    script = Path(__file__).with_name("gevent_server.py")
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"the gevent server died: {proc.stderr.read()}")
        yield json.loads(line)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def call(server, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", server["port"], timeout=SOCKET_GUARD)
    hdrs = {"Authorization": f"Bearer {server['token']}", **(headers or {})}
    data = None
    if body is not None:
        data = json.dumps(body)
        hdrs["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8")
    finally:
        conn.close()


def test_waits_and_streams_do_not_block_the_hub(server):
    results = {}

    def plain():
        results["plain"] = call(server, "POST", "/v1/responses", {"model": "tiny", "input": "hi"})

    waiter = threading.Thread(target=plain)
    waiter.start()
    # the plain request waits for a task nobody runs; the service still answers
    while True:
        status, text = call(server, "GET", "/v1/responses")
        assert status == 200
        listed = json.loads(text)["data"]
        if listed:
            break
    assert call(server, "GET", "/healthz")[0] == 200
    assert waiter.is_alive()
    response = listed[0]
    task_id = response["task"]["id"]

    def follow():
        results["stream"] = call(server, "GET", f"/v1/tasks/{task_id}/events",
                                 headers={"Accept": "text/event-stream"})

    reader = threading.Thread(target=follow)
    reader.start()
    assert call(server, "GET", "/readyz")[0] == 200
    assert reader.is_alive() and waiter.is_alive()

    status, text = call(server, "POST", f"/v1/responses/{response['id']}/cancel")
    assert status == 200 and json.loads(text)["status"] == "cancelled"
    waiter.join(SOCKET_GUARD)
    reader.join(SOCKET_GUARD)
    status, text = results["plain"]
    assert status == 200 and json.loads(text)["status"] == "cancelled"
    status, text = results["stream"]
    assert status == 200
    events = [line[len("event: "):] for line in text.splitlines() if line.startswith("event: ")]
    assert events[0] == "response.created" and events[-1] == "response.cancelled"


def test_a_body_sent_in_chunks_is_read_whole(server):
    """No Content-Length, Transfer-Encoding: chunked: the server decodes the chunks, the
    app reads them to the last one (the limit on such a body: test_responses.py)."""
    body = json.dumps({"model": "tiny", "input": "sent in chunks", "background": True}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", server["port"], timeout=SOCKET_GUARD)
    try:
        conn.request("POST", "/v1/responses", body=iter([body[:7], body[7:20], body[20:]]), encode_chunked=True,
                     headers={"Authorization": f"Bearer {server['token']}", "Content-Type": "application/json",
                              "Transfer-Encoding": "chunked"})
        resp = conn.getresponse()
        made = json.loads(resp.read())
    finally:
        conn.close()
    assert resp.status == 202, made
    status, text = call(server, "GET", f"/v1/responses/{made['id']}")
    assert status == 200 and json.loads(text)["id"] == made["id"]
