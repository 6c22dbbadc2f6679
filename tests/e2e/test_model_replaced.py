"""An operator replaces the file of a loaded model: the worker lives on and the
model is not served changed."""
from __future__ import annotations

import os
import shutil

from e2e_helpers import Server, sse_events

TERMINAL = ("response.completed", "response.incomplete", "response.failed", "response.cancelled")
ENDED_WELL = ("response.completed", "response.incomplete")  # incomplete: it reached max_output_tokens
LONG = {"input": "Count on:", "stream": True, "max_output_tokens": 1500, "temperature": 0}


def _first_text(events) -> dict:
    """Read a stream until its first text (the task decodes); that event."""
    for event in events:
        if event["type"] == "response.output_text.delta" or event["type"] in TERMINAL:
            return event
    raise AssertionError("the stream ended without an event")


def _last(events) -> dict:
    last = None
    for event in events:
        last = event
    assert last is not None and last["type"] in TERMINAL, last
    return last


def test_truncating_a_loaded_models_file_fails_it_cleanly_and_the_worker_lives(tmp_path, demo_model_path):
    replaced, other = tmp_path / "replaced.gguf", tmp_path / "other.gguf"
    shutil.copyfile(demo_model_path, replaced)
    shutil.copyfile(demo_model_path, other)
    server = Server(tmp_path / "data", tmp_path, replaced, {"LMSP_N_PARALLEL": "4"})
    server.start()
    try:
        server.operator("models", "add", str(other))
        token = server.pair()
        for model in ("replaced", "other"):  # both loaded in the one worker
            server.call("POST", "/v1/responses", {"model": model, "input": "Hi", "max_output_tokens": 2},
                        token=token)
        [worker] = server.workers()
        digest = server.call("GET", "/v1/models/replaced", token=token)["digest"]

        on_other = sse_events("127.0.0.1", server.port, "POST", "/v1/responses", token=token, timeout=60,
                              body={"model": "other", **LONG})
        on_replaced = sse_events("127.0.0.1", server.port, "POST", "/v1/responses", token=token, timeout=60,
                                 body={"model": "replaced", **LONG})
        assert _first_text(on_other)["type"] == "response.output_text.delta"
        _first_text(on_replaced)
        os.truncate(replaced, 1 << 20)  # what copying a new file over it does first

        status, body = server.request("POST", "/v1/responses", {"model": "replaced", "input": "Hi"}, token=token)
        assert (status, body["error"]["code"]) == (409, "model_changed"), (status, body)
        ended = _last(on_replaced)  # a clean end: failed as changed, or ended before it was seen
        if ended["type"] not in ENDED_WELL:
            assert ended["type"] == "response.failed", ended
            assert ended["response"]["error"]["code"] == "model_changed", ended
        assert _last(on_other)["type"] in ENDED_WELL

        server.check_alive()
        assert server.workers() == [worker]
        model = server.call("GET", "/v1/models/replaced", token=token)
        assert (model["state"], model["digest"]) == ("changed", digest)
        again = server.call("POST", "/v1/responses", {"model": "other", "input": "Hi", "max_output_tokens": 2},
                            token=token)
        assert again["status"] in ("completed", "incomplete")
    finally:
        server.stop(timeout=10)
