"""Small helpers of the API tests: an authenticated test client and SSE parsing."""
from __future__ import annotations

import json

import falcon.testing

from lmsp import auth


class Api:
    """``falcon.testing.TestClient`` with a bearer token."""

    def __init__(self, app, token: str | None = None) -> None:
        self.app = app
        self.client = falcon.testing.TestClient(app)
        self.token = token

    def as_(self, token: str | None) -> "Api":
        return Api(self.app, token)

    def request(self, method: str, path: str, *, headers: dict | None = None, **kw):
        headers = dict(headers or {})
        if self.token is not None:
            headers.setdefault("Authorization", f"Bearer {self.token}")
        return self.client.simulate_request(method, path, headers=headers, **kw)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, **kw):
        return self.request("POST", path, **kw)

    def delete(self, path, **kw):
        return self.request("DELETE", path, **kw)


def make_client(store, scopes, name="test") -> tuple[dict, str]:
    token = auth.new_token()
    client = store.create_client(name=name, scopes=list(scopes), token_hash=auth.hash_token(token))
    return client, token


def parse_sse(text: str) -> list[dict]:
    """SSE frames as dicts: ``{"id", "event", "data"}`` (data parsed), comments as ``{"comment"}``."""
    frames = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        frame: dict = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                frame.setdefault("comment", line[1:].strip())
                continue
            field, _, value = line.partition(": ")
            frame[field] = json.loads(value) if field == "data" else value
        frames.append(frame)
    return frames


def assert_error(result, status: int, code: str, param=None) -> dict:
    assert result.status_code == status, result.text
    body = result.json
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "param"}
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param, body
    return body["error"]
