"""Embeddings (B.11) with the scripted worker: the input forms, the list of
embedding objects in float or base64, and what is refused."""
from __future__ import annotations

import base64
import struct

import pytest
from api_helpers import assert_error


def embed(api, **fields):
    body = {"model": "tiny", "input": "hello world"}
    body.update(fields)
    return api.post("/v1/embeddings", json=body)


@pytest.mark.parametrize(("value", "n"), [("one text", 1), (["a", "b c"], 2), ([1, 2, 3], 1), ([[1], [2, 3]], 2)])
def test_every_input_form_gives_one_embedding_each(user, value, n):
    result = embed(user, input=value)
    assert result.status_code == 200, result.text
    body = result.json
    assert body["object"] == "list" and body["model"] == "tiny"
    assert [d["index"] for d in body["data"]] == list(range(n))
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 4 for d in body["data"])
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0


def test_base64_is_the_little_endian_floats(user):
    floats = embed(user, input=["a b"]).json["data"][0]["embedding"]
    packed = embed(user, input=["a b"], encoding_format="base64").json["data"][0]["embedding"]
    assert list(struct.unpack("<4f", base64.b64decode(packed))) == pytest.approx(floats)


def test_dimensions_only_the_models_own(user):
    assert embed(user, dimensions=4).status_code == 200
    assert_error(embed(user, dimensions=2), 400, "invalid_request", param="dimensions")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["a", ""]}, "input"),
        ({"input": [[]]}, "input"),
        ({"input": [1, "a"]}, "input"),
        ({"input": [-1]}, "input"),
        ({"input": None}, "input"),
        ({"encoding_format": "int8"}, "encoding_format"),
        ({"dimensions": 0}, "dimensions"),
        ({"extra": 1}, "extra"),
    ],
)
def test_bad_requests_are_400_with_their_param(user, fields, param):
    assert_error(embed(user, **fields), 400, "invalid_request", param=param)


def test_over_the_context_unknown_model_and_scope(user, app, store):
    from api_helpers import Api, make_client

    assert_error(embed(user, input="word " * 1001), 400, "context_length_exceeded")
    assert_error(embed(user, model="nope"), 404, "not_found", param="model")
    reader = Api(app, make_client(store, ["responses:read"], "reader")[1])
    assert_error(embed(reader), 403, "insufficient_scope")


def test_an_embeddings_request_is_a_task_of_the_store_deleted_once_answered(user, scripted, store):
    assert embed(user, input=["a", "b"]).status_code == 200
    task = scripted.embedded[-1]
    assert task["status"] == "running" and task["on_restart"] == "fail" and task["response_id"].startswith("embd-")
    assert store.list_tasks()["data"] == []  # deleted once answered


def test_an_idempotency_key_replays_the_answer(user, scripted):
    headers = {"Idempotency-Key": "emb-1"}
    first = user.post("/v1/embeddings", json={"model": "tiny", "input": ["a b", "c"]}, headers=headers)
    again = user.post("/v1/embeddings", json={"model": "tiny", "input": ["a b", "c"]}, headers=headers)
    assert again.headers.get("Idempotent-Replayed") == "true" and again.json == first.json
    assert len(scripted.embedded) == 1  # computed once
    other = user.post("/v1/embeddings", json={"model": "tiny", "input": "x"}, headers=headers)
    assert_error(other, 422, "idempotency_key_reused")


@pytest.fixture
def encoder(store):
    """An embedding model (a BERT encoder) beside the scripted worker's model."""
    store.put_model({"id": "minilm", "path": "minilm.gguf", "digest": "sha256:" + "1" * 64, "size_bytes": 1,
                     "format": "gguf", "architecture": "bert", "has_chat_template": False})
    return "minilm"


def test_an_embedding_model_says_what_it_does(user, encoder):
    assert user.get(f"/v1/models/{encoder}").json["capabilities"] == ["embeddings"]
    assert user.get("/v1/models/tiny").json["capabilities"] == ["generation", "embeddings"]
    assert embed(user, model=encoder).status_code == 200


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"input": "hi"}),
        ("/v1/responses", {"input": "hi", "background": True, "stream": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/completions", {"prompt": ["a", "b"]}),
    ],
)
def test_generation_refuses_an_embedding_model_before_any_task(user, encoder, store, path, body):
    answer = user.post(path, json={"model": encoder, **body})
    assert_error(answer, 400, "model_not_generative", param="model")
    assert store.list_tasks()["data"] == []
