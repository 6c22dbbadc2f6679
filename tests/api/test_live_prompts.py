"""Completions' prompts over the REAL runtime and engine: an empty text on a model
that adds a BOS token and on one that adds none (the demo model with its
vocabulary's ``add_bos_token`` off)."""
from __future__ import annotations

import pytest
from api_helpers import assert_error
from test_live import client, live  # noqa: F401  (the started runtime of test_live.py)

from lmsp.models import demo


@pytest.fixture(scope="module")
def no_bos(live):  # noqa: F811
    """The demo model, its tokenizer adding no BOS token, registered as ``nobos``."""
    usual = demo._tokenizer_keys

    def keys(*args):
        return tuple((k, False if k == "tokenizer.ggml.add_bos_token" else v, t, s) for k, v, t, s in usual(*args))

    mp = pytest.MonkeyPatch()
    mp.setattr(demo, "_tokenizer_keys", keys)
    try:
        demo.write_demo_model(live["config"].models_dir / "nobos.gguf")
    finally:
        mp.undo()
    registered = live["admin"].post("/v1/models", json={"path": "nobos.gguf", "id": "nobos"})
    assert registered.status_code == 201, registered.text
    return "nobos"


def test_an_empty_prompt_without_tokens_is_refused_naming_it(client, no_bos, live):  # noqa: F811
    assert live["runtime"].prompt_pieces(no_bos, "") == []
    assert len(live["runtime"].prompt_pieces("tiny", "")) == 1  # its BOS
    body = {"model": no_bos, "max_tokens": 2, "temperature": 0}
    before = client.get("/v1/tasks").json["data"]
    assert_error(client.post("/v1/completions", json={**body, "prompt": ""}), 400, "invalid_request", "prompt")
    assert_error(client.post("/v1/completions", json={**body, "prompt": [""]}), 400, "invalid_request", "prompt[0]")
    assert_error(client.post("/v1/completions", json={**body, "prompt": ["Hi", ""]}),
                 400, "invalid_request", "prompt[1]")
    assert_error(client.post("/v1/completions", json={**body, "prompt": [[]]}), 400, "invalid_request", "prompt[0]")
    assert client.get("/v1/tasks").json["data"] == before  # refused before any task existed
    unknown = client.post("/v1/completions", json={**body, "model": "nope", "prompt": ""})
    assert_error(unknown, 404, "not_found", "model")  # as for any prompt
    answered = client.post("/v1/completions", json={**body, "prompt": "Hi"})
    assert answered.status_code == 200, answered.text
    with_bos = client.post("/v1/completions", json={**body, "model": "tiny", "prompt": ""})
    assert with_bos.status_code == 200 and with_bos.json["usage"]["prompt_tokens"] == 1, with_bos.text
