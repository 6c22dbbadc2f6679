"""HEAD on the probes, through gunicorn: the GET's status and headers, no body, and
the connection goes on to the next request."""
from __future__ import annotations

import http.client


def test_head_probes_answer_like_get_on_one_connection(served):
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    try:
        for path in ("/healthz", "/readyz", "/metrics"):
            conn.request("HEAD", path)
            head = conn.getresponse()
            assert (head.status, head.read()) == (200, b""), path
            conn.request("GET", path)
            get = conn.getresponse()
            body = get.read()
            assert get.status == 200 and body, path
            assert head.getheader("Content-Type") == get.getheader("Content-Type"), path
            if path != "/metrics":  # its figures move with every request
                assert head.getheader("Content-Length") == get.getheader("Content-Length") == str(len(body))
    finally:
        conn.close()
