"""The API over the REAL runtime and engine with the tiny demo model: models
(B.4) and responses end to end."""
from __future__ import annotations

import shutil
import time

import httpx2
import jsonschema
import openai
import pytest
from api_helpers import Api, assert_error, live_service, make_client, sse_events

from lmsp.api.openapi import document

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}


def output_text(response: dict) -> str:
    return "".join(part["text"] for item in response["output"] for part in item["content"])


@pytest.fixture(scope="module")
def live(tmp_path_factory, demo_model_path):
    """One started runtime for the module (loading the model once), with the
    demo model copied into its models directory as ``tiny.gguf``."""
    data = tmp_path_factory.mktemp("live")
    (data / "models").mkdir(parents=True)
    (data / "models" / "notes.txt").write_text("not a model")
    with live_service(data, demo_model_path, n_ctx=512, n_parallel=4, max_output_tokens=16,
                      max_output_tokens_cap=64) as service:
        yield service


@pytest.fixture
def client(live):
    _, token = make_client(live["store"], ["responses:write", "responses:read", "models:read"])
    return Api(live["app"], token)


def test_registered_model_object(live):
    model = live["model"]
    assert model["id"] == "tiny" and model["object"] == "model" and model["owned_by"] == "local"
    assert model["digest"].startswith("sha256:") and len(model["digest"]) == 7 + 64
    assert model["format"] == "gguf" and model["architecture"] == "llama"
    assert model["size_bytes"] > 0 and isinstance(model["created"], int)
    assert model["state"] in ("available", "loaded")
    assert "path" not in model


def test_models_read(live, client):
    listed = client.get("/v1/models").json
    assert listed["object"] == "list" and [m["id"] for m in listed["data"]] == ["tiny"]
    assert client.get("/v1/models/tiny").json["digest"] == live["model"]["digest"]
    assert client.get("/v1/models/tiny").json["has_chat_template"] is True  # the demo model's ChatML
    assert_error(client.get("/v1/models/nope"), 404, "not_found")


@pytest.mark.parametrize("path", ["../outside.gguf", "/etc/passwd", "missing.gguf", "notes.txt", "."])
def test_register_refuses_bad_paths(live, path):
    result = live["admin"].post("/v1/models", json={"path": path})
    err = assert_error(result, 400, "invalid_request")
    assert err["message"]


def test_a_blank_path_is_refused_by_the_service_and_the_document(live):
    assert_error(live["admin"].post("/v1/models", json={"path": "  "}), 400, "invalid_request", "path")
    schema = document()["components"]["schemas"]["RegisterModel"]
    assert not jsonschema.Draft202012Validator(schema).is_valid({"path": "  "})
    assert jsonschema.Draft202012Validator(schema).is_valid({"path": " tiny.gguf"})


def test_a_missing_model_file_is_refused_as_a_changed_one_is(live, client):
    """Not loaded, its file gone: 409 at once, as for a file known to have changed (B.4), not a
    task that fails later; the openai package raises its ConflictError."""
    models_dir = live["config"].models_dir
    shutil.copyfile(models_dir / "tiny.gguf", models_dir / "gone.gguf")
    assert live["admin"].post("/v1/models", json={"path": "gone.gguf"}).status_code == 201
    (models_dir / "gone.gguf").unlink()
    for stream in (False, True):
        err = assert_error(client.post("/v1/responses", json={"model": "gone", "input": "Hi", "stream": stream}),
                           409, "model_changed", param="model")
        assert "missing" in err["message"]
    assert client.get("/v1/models/gone").json["state"] == "missing"
    _, token = make_client(live["store"], ["responses:write"])
    sdk = openai.OpenAI(api_key=token, base_url="http://lmsp.test/v1", max_retries=0,
                        http_client=httpx2.Client(transport=httpx2.WSGITransport(app=live["app"])))
    with pytest.raises(openai.ConflictError) as refused:
        sdk.responses.create(model="gone", input="Hi", stream=True)
    assert refused.value.code == "model_changed"
    assert live["admin"].delete("/v1/models/gone").status_code == 200


def test_register_validation(live):
    admin = live["admin"]
    assert_error(admin.post("/v1/models", json={}), 400, "invalid_request", "path")
    assert_error(admin.post("/v1/models", json={"path": 5}), 400, "invalid_request", "path")
    assert_error(admin.post("/v1/models", json={"path": "tiny.gguf", "id": "a/b"}), 400,
                 "invalid_request", "id")
    assert_error(admin.post("/v1/models", json={"path": "tiny.gguf", "size": 1}), 400,
                 "invalid_request", "size")


def test_load_unload_and_delete(live, client):
    admin = live["admin"]
    again = admin.post("/v1/models", json={"path": "tiny.gguf", "id": "copy"},
                       headers={"Idempotency-Key": "reg-copy"})
    assert again.status_code == 201 and again.json["digest"] == live["model"]["digest"]
    replay = admin.post("/v1/models", json={"path": "tiny.gguf", "id": "copy"},
                        headers={"Idempotency-Key": "reg-copy"})
    assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"
    loaded = admin.post("/v1/models/copy/load")
    assert loaded.status_code == 200 and loaded.json["state"] == "loaded"
    unloaded = admin.post("/v1/models/copy/unload")
    assert unloaded.status_code == 200 and unloaded.json["state"] == "available"
    assert_error(admin.post("/v1/models/nope/load"), 404, "not_found")
    deleted = admin.delete("/v1/models/copy")
    assert deleted.json == {"id": "copy", "object": "model", "deleted": True}
    assert_error(admin.get("/v1/models/copy"), 404, "not_found")
    assert_error(admin.delete("/v1/models/copy"), 404, "not_found")


def test_plain_response(client):
    result = client.post("/v1/responses", json={"model": "tiny", "input": "Once upon a time",
                                                "temperature": 0, "max_output_tokens": 8})
    assert result.status_code == 200, result.text
    body = result.json
    assert body["status"] in ("completed", "incomplete")
    assert body["usage"]["input_tokens"] > 0 and 0 < body["usage"]["output_tokens"] <= 8
    assert body["output"][0]["type"] == "message" and body["output"][0]["role"] == "assistant"
    if body["status"] == "incomplete":
        assert body["incomplete_details"] == {"reason": "max_output_tokens"}


def test_same_seed_same_output(client):
    request = {"model": "tiny", "input": "Tell me a story", "seed": 42, "temperature": 1.0,
               "max_output_tokens": 6}
    first = client.post("/v1/responses", json=request).json
    second = client.post("/v1/responses", json=request).json
    assert first["seed"] == second["seed"] == 42
    assert output_text(first) == output_text(second)


def test_stream_deltas_make_the_output(client):
    result = client.post("/v1/responses", json={"model": "tiny", "input": "Hello", "stream": True,
                                                "max_output_tokens": 10})
    assert result.status_code == 200
    frames = sse_events(result.text)  # keep-alives carry no event
    ids = [int(f["id"]) for f in frames]
    assert ids == sorted(set(ids)) and ids[0] == 1
    assert frames[0]["event"] == "response.created" and frames[-1]["event"] in TERMINAL
    # task.running is in the task's log, numbered in the gap the stream leaves
    task_id = frames[0]["data"]["response"]["task"]["id"]
    log = client.get(f"/v1/tasks/{task_id}/events").json["data"]
    running = [e["sequence_number"] for e in log if e["type"] == "task.running"]
    assert len(running) == 1 and running[0] not in ids and ids[0] < running[0] < ids[-1]
    text = "".join(f["data"]["delta"] for f in frames if f["event"] == "response.output_text.delta")
    final = frames[-1]["data"]["response"]
    assert final["output"][0]["content"][0]["text"] == text


def test_background_then_follow_and_replay(client):
    created = client.post("/v1/responses", json={"model": "tiny", "input": "Hi", "background": True,
                                                 "max_output_tokens": 6})
    assert created.status_code == 202
    rid, tid = created.json["id"], created.json["task"]["id"]
    frames = sse_events(client.get(f"/v1/tasks/{tid}/events", headers={"Accept": "text/event-stream"}).text)
    assert frames[-1]["event"] in TERMINAL
    final = client.get(f"/v1/responses/{rid}").json
    assert final["status"] in ("completed", "incomplete")
    resumed = sse_events(client.get(f"/v1/responses/{rid}", params={"stream": "true", "starting_after": "3"}).text)
    # the response's stream after event 3: the task log's events after it but the task's own
    # (task.loading where the model was not loaded yet, task.running)
    assert resumed == [f for f in frames if int(f["id"]) > 3 and not f["event"].startswith("task.")]
    assert client.get(f"/v1/tasks/{tid}").json["status"] == "completed"


def test_context_length_exceeded_when_loaded(live, client):
    live["admin"].post("/v1/models/tiny/load")
    result = client.post("/v1/responses", json={"model": "tiny", "input": "word " * 2000})
    assert_error(result, 400, "context_length_exceeded", param="input")


def test_the_openai_sdk_works_unchanged(live):
    _, token = make_client(live["store"], ["responses:write", "responses:read", "models:read"])
    sdk = openai.OpenAI(api_key=token, base_url="http://lmsp.test/v1", max_retries=0,
                        http_client=httpx2.Client(transport=httpx2.WSGITransport(app=live["app"])))
    assert "tiny" in [m.id for m in sdk.models.list()]
    plain = sdk.responses.create(model="tiny", input="Hello", instructions="Answer.", max_output_tokens=6,
                                 temperature=0)
    assert plain.status in ("completed", "incomplete") and plain.id.startswith("resp_")
    events = list(sdk.responses.create(model="tiny", input="Hello", instructions="Answer.",
                                       max_output_tokens=6, temperature=0, stream=True))
    assert events[0].type == "response.created" and events[-1].type in TERMINAL
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == plain.output_text  # greedy: the same text both ways
    background = sdk.responses.create(model="tiny", input="Hi", background=True, max_output_tokens=4)
    assert background.status == "queued"
    resumed = list(sdk.responses.retrieve(background.id, stream=True, starting_after=1))
    assert resumed[0].sequence_number == 2 and resumed[-1].type in TERMINAL
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.responses.create(model="tiny", input="Hello", temperature=5)
    assert bad.value.status_code == 400 and bad.value.code == "invalid_request"
    with pytest.raises(openai.ConflictError):
        sdk.responses.cancel(background.id)  # it finished already


def test_the_openai_sdk_sees_a_failed_stream_as_its_failed_event(live):
    """A file changed in place (same size: only the load's digest check finds it) fails the
    task; the unmodified openai package gets a ResponseFailedEvent, not an exception (B.6)."""
    models_dir = live["config"].models_dir
    shutil.copyfile(models_dir / "tiny.gguf", models_dir / "edited.gguf")
    assert live["admin"].post("/v1/models", json={"path": "edited.gguf"}).status_code == 201
    with open(models_dir / "edited.gguf", "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0xFF]))
    _, token = make_client(live["store"], ["responses:write", "responses:read"])
    sdk = openai.OpenAI(api_key=token, base_url="http://lmsp.test/v1", max_retries=0,
                        http_client=httpx2.Client(transport=httpx2.WSGITransport(app=live["app"])))
    events = list(sdk.responses.create(model="edited", input="Hello", max_output_tokens=4, stream=True))
    failed = events[-1]
    assert isinstance(failed, openai.types.responses.ResponseFailedEvent), events
    assert failed.response.error.code == "model_changed" and "changed" in failed.response.error.message
    retrieved = sdk.responses.retrieve(failed.response.id)
    assert retrieved.status == "failed" and retrieved.error.code == "model_changed"
    replayed = list(sdk.responses.retrieve(failed.response.id, stream=True, starting_after=0))
    assert [e.type for e in replayed] == [e.type for e in events]
    assert live["admin"].delete("/v1/models/edited").status_code == 200


def test_logprobs_are_the_same_live_replayed_and_stored(client):
    body = {"model": "tiny", "input": "Hello", "stream": True, "max_output_tokens": 12, "temperature": 0,
            "include": ["message.output_text.logprobs"], "top_logprobs": 2}
    frames = sse_events(client.post("/v1/responses", json=body).text)
    streamed = [lp for f in frames if f["event"] == "response.output_text.delta" for lp in f["data"]["logprobs"]]
    final = frames[-1]["data"]["response"]
    part = final["output"][0]["content"][0]
    assert streamed and part["logprobs"] == streamed
    assert b"".join(bytes(lp["bytes"]) for lp in streamed).decode("utf-8") == part["text"]
    assert all(len(lp["top_logprobs"]) == 2 and lp["logprob"] <= 0 for lp in streamed)
    done = [f["data"] for f in frames if f["event"] == "response.output_text.done"]
    assert done[0]["logprobs"] == streamed
    assert client.get(f"/v1/responses/{final['id']}").json["output"][0]["content"][0]["logprobs"] == streamed
    replay = sse_events(client.get(f"/v1/responses/{final['id']}", params={"stream": "true"}).text)
    assert [f["data"] for f in replay] == [f["data"] for f in frames]


def test_no_logprobs_unless_asked_for(client):
    result = client.post("/v1/responses", json={"model": "tiny", "input": "Hello", "max_output_tokens": 4})
    assert result.json["output"][0]["content"][0]["logprobs"] == []


def test_a_model_object_shows_its_file_memory_and_kv_files(live, client):
    """``file`` relative to the models directory; ``memory_bytes`` while loaded here
    (weights and KV cache), else null; the KV files kept for the model's file."""
    assert live["model"]["file"] == "tiny.gguf"
    assert (live["model"]["kv_files"], live["model"]["kv_bytes"]) == (0, 0)  # registered before any turn
    admin = live["admin"]
    admin.post("/v1/models/tiny/unload")
    unloaded = client.get("/v1/models/tiny").json
    assert unloaded["state"] == "available" and unloaded["memory_bytes"] is None
    loaded = admin.post("/v1/models/tiny/load").json
    assert loaded["state"] == "loaded" and loaded["file"] == "tiny.gguf"
    assert loaded["memory_bytes"] > loaded["size_bytes"]  # the weights and a KV cache of 4 x 512 cells
    assert [m["memory_bytes"] for m in client.get("/v1/models").json["data"]] == [loaded["memory_bytes"]]
    # a stored response's turn keeps its KV in a file, which the model object counts
    created = client.post("/v1/responses", json={"model": "tiny", "input": "Count: one two", "max_output_tokens": 4})
    assert created.status_code == 200, created.text
    kv_dir = live["config"].data_dir / "kv"

    def kv_files() -> list:  # a write's temporary file (.tmp-...) is not one, and may go at any time
        return [f for f in kv_dir.glob("*.kv") if not f.name.startswith(".")]

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not kv_files():
        time.sleep(0.05)
    files = kv_files()
    assert files, "no KV file was written"
    deadline = time.monotonic() + 10
    shown = client.get("/v1/models/tiny").json
    while time.monotonic() < deadline and shown["kv_files"] != len(files):
        time.sleep(0.2)
        files = kv_files()
        shown = client.get("/v1/models/tiny").json
    assert shown["kv_files"] == len(files)
    assert shown["kv_bytes"] == sum(f.stat().st_size for f in files) > 0
