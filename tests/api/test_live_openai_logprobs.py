"""Log probabilities of Chat Completions and Completions over the REAL runtime and
engine with the tiny demo model: the engine's entries in OpenAI's shapes, the same
streamed, replayed and stored."""
from __future__ import annotations

from api_helpers import sse_events
from test_live import client, live  # noqa: F401  (the started runtime of test_live.py)


def chunks_of(text: str) -> list[dict]:
    frames = sse_events(text)
    assert frames[-1]["data"] == "[DONE]", frames
    return [f["data"] for f in frames[:-1]]


def test_chat_logprobs_live_replayed_and_stored(client):  # noqa: F811
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 12,
            "temperature": 0, "logprobs": True, "top_logprobs": 3, "store": True, "stream": True}
    headers = {"Idempotency-Key": "live-chat-logprobs"}
    chunks = chunks_of(client.post("/v1/chat/completions", json=body, headers=headers).text)
    streamed = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                for e in c["choices"][0]["logprobs"]["content"]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert streamed and b"".join(bytes(e["bytes"]) for e in streamed).decode("utf-8") == text
    assert all(len(e["top_logprobs"]) == 3 and e["logprob"] <= 0 for e in streamed)
    stored = client.get(f"/v1/chat/completions/{chunks[0]['id']}").json
    assert stored["choices"][0]["logprobs"] == {"content": streamed, "refusal": None}
    assert chunks_of(client.post("/v1/chat/completions", json=body, headers=headers).text) == chunks
    plain = client.post("/v1/chat/completions", json=dict(body, stream=False)).json
    assert plain["choices"][0]["logprobs"]["content"] == streamed  # temperature 0: the same tokens


def test_completion_logprobs_live_with_echo(client):  # noqa: F811
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "logprobs": 2,
            "echo": True}
    choice = client.post("/v1/completions", json=body).json["choices"][0]
    logprobs = choice["logprobs"]
    n = len(logprobs["tokens"])
    assert all(len(logprobs[name]) == n for name in ("token_logprobs", "top_logprobs", "text_offset"))
    echoed = logprobs["token_logprobs"].index(next(v for v in logprobs["token_logprobs"] if v is not None))
    assert echoed >= 4 and logprobs["token_logprobs"][:echoed] == [None] * echoed
    generated = logprobs["tokens"][echoed:]
    assert "".join(generated) == choice["text"][len("Once upon a time"):]
    assert logprobs["text_offset"][echoed] == len("Once upon a time")
    assert logprobs["text_offset"] == sorted(logprobs["text_offset"])
    assert all(2 <= len(top) <= 3 for top in logprobs["top_logprobs"][echoed:])
    streamed = chunks_of(client.post("/v1/completions", json=dict(body, stream=True)).text)
    parts = [c["choices"][0]["logprobs"] for c in streamed if c["choices"] and c["choices"][0]["logprobs"]]
    assert {name: [v for p in parts for v in p[name]] for name in logprobs} == logprobs
