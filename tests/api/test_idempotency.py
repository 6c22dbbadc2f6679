"""B.8: Idempotency-Key on every POST."""
from __future__ import annotations

import pytest
from api_helpers import assert_error, parse_sse

from lmsp import auth
from lmsp.api.idempotency import fingerprint

KEY = "Idempotency-Key"


def post(api, body, key, path="/v1/responses"):
    return api.post(path, json=body, headers={KEY: key})


def test_background_replay_returns_the_stored_202(user, scripted, store):
    scripted.auto = False
    body = {"model": "tiny", "input": "hi", "background": True}
    first = post(user, body, "k-1")
    assert first.status_code == 202 and "Idempotent-Replayed" not in first.headers
    again = post(user, body, "k-1")
    assert again.status_code == 202
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Location"] == first.headers["Location"]
    assert again.json == first.json
    assert len(store.list_tasks()["data"]) == 1  # no second task, ever


def test_plain_replay_after_finish_is_the_current_response(user, store):
    body = {"model": "tiny", "input": "hi"}
    first = post(user, body, "k-plain")
    again = post(user, body, "k-plain")
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json == first.json
    assert len(store.list_tasks()["data"]) == 1


def test_stream_replay_is_the_event_stream_again(user, store):
    body = {"model": "tiny", "input": "hi", "stream": True}
    first = parse_sse(post(user, body, "k-stream").text)
    again = post(user, body, "k-stream")
    assert again.headers["Idempotent-Replayed"] == "true"
    assert parse_sse(again.text) == first
    assert len(store.list_tasks()["data"]) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_store_false_response_deleted_after_delivery_is_replayed_not_run_again(user, store, stream):
    """The client's connection may have dropped before the answer arrived: its retry
    gets the final Response object (as JSON: the stream is gone), no second task."""
    body = {"model": "tiny", "input": "hi", "store": False, "stream": stream}
    first = post(user, body, f"k-nostore-{stream}")
    assert first.status_code == 200
    assert store.list_tasks()["data"] == []  # deleted once delivered
    again = post(user, body, f"k-nostore-{stream}")
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json["status"] == "completed" and again.json["output"]
    if not stream:
        assert again.json == first.json
    assert store.list_tasks()["data"] == []  # no second task, ever


def test_a_deleted_responses_key_answers_404_and_runs_nothing(user, store):
    body = {"model": "tiny", "input": "hi"}
    rid = post(user, body, "k-deleted").json["id"]
    assert user.delete(f"/v1/responses/{rid}").status_code == 200
    again = post(user, body, "k-deleted")
    assert_error(again, 404, "not_found")
    assert again.headers["Idempotent-Replayed"] == "true"
    assert store.list_tasks()["data"] == []


def test_retention_before_a_key_expires_keeps_the_key(user, store, clock):
    body = {"model": "tiny", "input": "hi", "background": True}
    assert post(user, body, "k-gc").status_code == 202
    user.get("/v1/responses")  # (the scripted runtime finishes it)
    clock.advance(3600)
    assert store.gc(retention=60)["tasks"] == 1  # a retention shorter than the key's life
    again = post(user, body, "k-gc")
    assert_error(again, 404, "not_found")
    assert store.list_tasks()["data"] == []


def test_same_key_other_request_is_422(user, scripted):
    scripted.auto = False
    post(user, {"model": "tiny", "input": "hi", "background": True}, "k-2")
    reused = post(user, {"model": "tiny", "input": "bye", "background": True}, "k-2")
    assert_error(reused, 422, "idempotency_key_reused")
    other_path = user.post("/v1/tasks/task_X/cancel", headers={KEY: "k-2"})
    assert_error(other_path, 422, "idempotency_key_reused")


def test_key_in_use_while_the_first_request_runs_is_409(user, scripted, store):
    scripted.auto = False
    client = store.client_by_token_hash(auth.hash_token(user.token))
    body = {"model": "tiny", "input": "hi"}
    # what a first plain request commits before it waits for its task
    fp = fingerprint(client["id"], "POST", "/v1/responses", body)
    store.create_task(client_id=client["id"], model="tiny", request=body, on_restart="fail",
                      background=False, stream=False, idempotency=("k-busy", fp))
    assert_error(post(user, body, "k-busy"), 409, "idempotency_key_in_use")
    # a generic POST holding its key while it runs
    rid = store.list_responses()["data"][0]["id"]
    path = f"/v1/responses/{rid}/cancel"
    assert store.idempotency_begin(client["id"], "k-cancel", fingerprint(client["id"], "POST", path, None)) is None
    assert_error(user.post(path, headers={KEY: "k-cancel"}), 409, "idempotency_key_in_use")
    assert store.get_task(store.task_id_for_response(rid))["status"] == "queued"


def test_keys_are_per_client(user, other, scripted, store):
    scripted.auto = False
    body = {"model": "tiny", "input": "hi", "background": True}
    a = post(user, body, "shared")
    b = post(other, body, "shared")
    assert a.status_code == b.status_code == 202
    assert a.json["id"] != b.json["id"]


def test_cancel_replay(user, scripted):
    scripted.auto = False
    rid = user.post("/v1/responses", json={"model": "tiny", "input": "x", "background": True}).json["id"]
    first = user.post(f"/v1/responses/{rid}/cancel", headers={KEY: "c-1"})
    again = user.post(f"/v1/responses/{rid}/cancel", headers={KEY: "c-1"})
    assert first.status_code == again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true" and again.json == first.json
    # no body and an empty object are the same request (the body is optional)
    with_body = user.post(f"/v1/responses/{rid}/cancel", headers={KEY: "c-1"}, json={})
    assert with_body.status_code == 200 and with_body.headers["Idempotent-Replayed"] == "true"
    user.post(f"/v1/responses/{rid}/cancel", headers={KEY: "c-2"}, json={})
    without = user.post(f"/v1/responses/{rid}/cancel", headers={KEY: "c-2"})
    assert without.status_code == 200 and without.headers["Idempotent-Replayed"] == "true"


def test_a_key_is_kept_24_hours(user, scripted, clock):
    """B.8: keys kept 24 hours (the shipped setting)."""
    scripted.auto = False
    body = {"model": "tiny", "input": "x", "background": True}
    first = user.post("/v1/responses", json=body, headers={KEY: "day"})
    clock.advance(24 * 3600 - 60)
    again = user.post("/v1/responses", json=body, headers={KEY: "day"})
    assert again.headers.get("Idempotent-Replayed") == "true" and again.json["id"] == first.json["id"]
    clock.advance(120)
    later = user.post("/v1/responses", json=body, headers={KEY: "day"})
    assert later.status_code == 202 and "Idempotent-Replayed" not in later.headers
    assert later.json["id"] != first.json["id"]


def test_errors_release_the_key(user):
    # a cancel of an unknown response fails: the key is not spent on the error
    assert_error(user.post("/v1/responses/resp_X/cancel", headers={KEY: "e-1"}), 404, "not_found")
    assert_error(user.post("/v1/responses/resp_X/cancel", headers={KEY: "e-1"}), 404, "not_found")


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "tab\there", "new\nline"])
def test_bad_keys_are_400(user, store, key):
    result = user.post("/v1/responses", json={"model": "tiny", "input": "hi"},
                       headers={KEY: key.encode("utf-8").decode("latin-1")})
    assert_error(result, 400, "invalid_request", param="Idempotency-Key")
    assert store.list_tasks()["data"] == []


def test_longest_key_is_fine(user, scripted):
    scripted.auto = False
    key = "~" * 255
    result = post(user, {"model": "tiny", "input": "hi", "background": True}, key)
    assert result.status_code == 202
