"""Retention (B.10): finished tasks go in small batches; unfinished ones never."""
from __future__ import annotations

import pytest

from lmsp.errors import NotFound

DAY = 86400.0


def finish(store, tid: str, owner: str = "w1", deltas: int = 1) -> None:
    store.claim(owner, limit=100, lease=30)
    store.set_running(tid, owner)
    for i in range(deltas):
        store.append_step(owner, [{"task_id": tid, "delta": f"{i}", "tokens": [i]}])
    store.append_step(owner, [{"task_id": tid, "finish": "stop"}])


def test_gc_deletes_old_finished_tasks_with_events_and_responses(store, make_task, clock):
    old = make_task(idempotency=("k-old", "fp"))
    finish(store, old["task"]["id"], deltas=30)
    clock.advance(8 * DAY)
    recent = make_task()
    finish(store, recent["task"]["id"])
    counts = store.gc(retention=7 * DAY, batch=7)  # forces a long log to go in slices
    assert counts["tasks"] == 1 and counts["events"] == store_events_of_finished_run(30)
    with pytest.raises(NotFound):
        store.get_response(old["response"]["id"])
    with pytest.raises(NotFound):
        store.events(old["task"]["id"])
    assert store.get_task(recent["task"]["id"])["status"] == "completed"
    assert store.gc(retention=7 * DAY) == {"tasks": 0, "events": 0, "idempotency_keys": 0, "pairings": 0,
                                              "client_usage": 0, "service_history": 0}
    # its idempotency key went with it: the key can be used afresh
    assert make_task(idempotency=("k-old", "fp"))["replay"] is None


def store_events_of_finished_run(deltas: int) -> int:
    # created, queued, running, in_progress, item added, part added, deltas, 3 done, completed
    return 2 + 2 + 2 + deltas + 3 + 1


def test_gc_never_deletes_unfinished_tasks_however_old(store, make_task, clock):
    queued = make_task()["task"]["id"]
    running = make_task()["task"]["id"]
    store.claim("w1", limit=1, lease=30)  # takes `queued` (oldest)
    store.claim("w1", limit=1, lease=30)
    store.set_running(running, "w1")
    cancelling = make_task()["task"]["id"]
    store.claim("w1", limit=1, lease=30)
    store.set_running(cancelling, "w1")
    store.cancel(cancelling)
    clock.advance(1000 * DAY)
    counts = store.gc(retention=0, batch=1)
    assert counts["tasks"] == 0
    for tid in (queued, running, cancelling):
        assert store.get_task(tid)["status"] in ("queued", "running", "cancelling")
        assert store.last_sequence(tid) == len(store.events(tid)["data"])


def finish_with_tokens(store, tid: str, tokens: int) -> None:
    store.claim("w1", limit=100, lease=30)
    store.set_running(tid, "w1")
    store.append_step("w1", [{"task_id": tid, "delta": "x", "tokens": [1], "finish": "stop",
                              "usage": {"input_tokens": tokens - 1, "output_tokens": 1}}])


def test_gc_deletes_the_clients_usage_of_hours_past_retention(store, make_task, clock):
    hour = 500_000
    clock.now = hour * 3600 + 10.0
    finish_with_tokens(store, make_task(client_id="cli_a")["task"]["id"], 7)
    clock.advance(3600)
    finish_with_tokens(store, make_task(client_id="cli_b")["task"]["id"], 5)
    assert [(u["client_id"], u["hour_start"]) for u in store.usage()] == [("cli_a", hour * 3600),
                                                                         ("cli_b", (hour + 1) * 3600)]
    clock.now = hour * 3600 + DAY + 3590.0  # a day after a moment of cli_a's hour: it is kept
    assert store.gc(retention=DAY)["client_usage"] == 0
    clock.advance(20.0)  # a day after the end of cli_a's hour: it goes, cli_b's stays
    assert store.gc(retention=DAY)["client_usage"] == 1
    assert [(u["client_id"], u["tokens"]) for u in store.usage()] == [("cli_b", 5)]


def test_gc_deletes_expired_idempotency_keys_and_spent_pairings(store, make_task, clock):
    store.idempotency_begin("cli_a", "k1", "fp")
    store.idempotency_finish("cli_a", "k1", 200, {})
    store.create_pairing(code_hash="c", scopes=[], expires_at=clock.now + 60)
    clock.advance(2 * DAY)
    counts = store.gc(retention=DAY)
    assert counts["idempotency_keys"] == 1 and counts["pairings"] == 1
    assert store.idempotency_begin("cli_a", "k1", "other") is None
