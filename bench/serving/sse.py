"""HTTP on loopback: one JSON exchange, and the messages of a server-sent event stream."""
from __future__ import annotations

import http.client
import json


def http_json(port: int, method: str, path: str, body=None, headers=None,
              timeout: float = 30.0) -> tuple[int, dict | None]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        return resp.status, parsed
    finally:
        conn.close()



def iter_sse(resp: http.client.HTTPResponse):
    """Yield (event, data) for each SSE message; comments are skipped."""
    event, data = None, []
    while True:
        line = resp.readline()
        if not line:
            if data:
                yield event, "\n".join(data)
            return
        line = line.rstrip(b"\r\n")
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = None, []
            continue
        if line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if name == b"event":
            event = value.decode()
        elif name == b"data":
            data.append(value.decode("utf-8", "replace"))


