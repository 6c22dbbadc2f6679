"""Idempotency keys (B.8): decided inside the transaction that creates the task."""
from __future__ import annotations

import pytest

from lmsp.errors import IdempotencyKeyInUse, IdempotencyKeyReused
from lmsp.store import fingerprint


def test_fingerprint_is_canonical():
    a = fingerprint("cli_a", "post", "/v1/responses", {"b": 1, "a": [1, 2]})
    assert a == fingerprint("cli_a", "POST", "/v1/responses", {"a": [1, 2], "b": 1})
    assert len(a) == 64
    assert a != fingerprint("cli_b", "POST", "/v1/responses", {"a": [1, 2], "b": 1})
    assert a != fingerprint("cli_a", "POST", "/v1/responses", {"a": [2, 1], "b": 1})


def test_background_key_replays_the_202(store, make_task):
    first = make_task(idempotency=("k", "fp1"))
    again = make_task(idempotency=("k", "fp1"))
    assert again["replay"] == (202, first["response"])
    assert again["task"]["id"] == first["task"]["id"]
    assert store.list_tasks(limit=100)["data"] == [store.get_task(first["task"]["id"])]
    with pytest.raises(IdempotencyKeyReused):
        make_task(idempotency=("k", "fp2"))
    other_client = make_task(client_id="cli_b", idempotency=("k", "fp1"))
    assert other_client["replay"] is None  # keys are scoped per client


def test_plain_request_key_follows_its_task(store, make_task):
    first = make_task(background=False, idempotency=("k", "fp"))
    tid = first["task"]["id"]
    with pytest.raises(IdempotencyKeyInUse):
        make_task(background=False, idempotency=("k", "fp"))
    store.claim("w1", limit=1, lease=30)
    store.set_running(tid, "w1")
    store.append_step("w1", [{"task_id": tid, "delta": "done", "tokens": [1], "finish": "stop"}])
    again = make_task(background=False, idempotency=("k", "fp"))
    status, body = again["replay"]
    assert status == 200 and body["status"] == "completed" and body["id"] == first["response"]["id"]
    assert len(store.list_tasks(limit=100)["data"]) == 1


def test_keys_expire(store, make_task, clock):
    first = make_task(idempotency=("k", "fp"))
    clock.advance(store.idempotency_ttl + 1)
    second = make_task(idempotency=("k", "fp"))
    assert second["replay"] is None and second["task"]["id"] != first["task"]["id"]


def test_generic_post_keys(store):
    assert store.idempotency_begin("cli_a", "k", "fp") is None
    with pytest.raises(IdempotencyKeyInUse):
        store.idempotency_begin("cli_a", "k", "fp")
    with pytest.raises(IdempotencyKeyReused):
        store.idempotency_begin("cli_a", "k", "other")
    store.idempotency_finish("cli_a", "k", 201, {"ok": True})
    assert store.idempotency_begin("cli_a", "k", "fp") == (201, {"ok": True})
    assert store.idempotency_begin("cli_a", "k2", "fp") is None
    store.idempotency_abort("cli_a", "k2")
    assert store.idempotency_begin("cli_a", "k2", "fp") is None  # released: may go ahead again


def test_a_response_key_is_not_a_generic_key(store, make_task):
    make_task(background=False, idempotency=("k", "fp"))
    with pytest.raises(IdempotencyKeyInUse):
        store.idempotency_begin("cli_a", "k", "fp")


def test_an_abandoned_processing_key_can_be_taken_over(store, clock):
    assert store.idempotency_begin("cli_a", "k", "fp") is None  # and the process died
    with pytest.raises(IdempotencyKeyInUse):
        store.idempotency_begin("cli_a", "k", "fp")
    clock.advance(store.PROCESSING_TIMEOUT + 1)
    assert store.idempotency_begin("cli_a", "k", "fp") is None
