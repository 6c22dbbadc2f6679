"""Start-up recovery: every cell of the 11.3 table, and dead-worker recovery."""
from __future__ import annotations

import pytest

from lmsp.store import RECOVERY
from store_checks import SPEC_RECOVERY, all_events, assert_consistent, assert_gapless, event_types

EXPECTED_EVENT = {"failed": "response.failed", "cancelled": "response.cancelled"}
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def put_in_state(store, make_task, state: str, policy: str) -> str:
    tid = make_task(policy)["task"]["id"]
    if state == "queued":
        return tid
    store.claim("w1", limit=1, lease=30)
    store.set_loading(tid, "w1")
    if state == "loading":
        return tid
    store.set_running(tid, "w1")
    store.append_step("w1", [{"task_id": tid, "delta": "Hel", "tokens": [11, 12], "kv_path": "snap/1.kv"}])
    store.append_step("w1", [{"task_id": tid, "delta": "", "tokens": [13]}])
    if state == "cancelling":
        store.cancel(tid)
    return tid


def test_the_stores_table_is_the_contracts():
    assert RECOVERY == SPEC_RECOVERY


@pytest.mark.parametrize("policy", ["fail", "retry", "resume"])
@pytest.mark.parametrize("state", ["queued", "loading", "running", "cancelling"])
def test_recovery_table_cell(store, make_task, state, policy):
    tid = put_in_state(store, make_task, state, policy)
    assert store.get_task(tid)["status"] == state
    before = store.last_sequence(tid)
    report = store.recover(startup=True)
    target = SPEC_RECOVERY[(state, policy)]
    task = store.get_task(tid)
    assert task["status"] == target
    new = all_events(store, tid)[before:]
    assert_gapless(store, tid)
    assert_consistent(store, tid)
    closing = []
    if state in ("running", "cancelling") and target in ("failed", "cancelled"):
        # the output item its first delta opened is closed first: incomplete, with the text so far
        closing, new = new[:3], new[3:]
        assert [e["type"] for e in closing] == CLOSING
        assert closing[0]["text"] == "Hel" and closing[2]["item"]["status"] == "incomplete"
    assert len(new) == 1  # the new state and exactly one event of it, in one transaction
    event = new[0]
    assert event["sequence_number"] == before + 1 + len(closing)
    if target == "failed":
        assert report["failed"] == [tid]
        assert event["type"] == "response.failed"
        assert "error" not in event  # B.6: the error is the response's, not a key of the event
        assert task["error"]["code"] == "server_restarted"
        assert event["response"]["status"] == "failed"
        assert event["response"]["error"]["code"] == "server_restarted"
    elif target == "cancelled":
        assert report["cancelled"] == [tid] and event["type"] == "response.cancelled"
        assert event["response"]["status"] == "cancelled" and task["error"] is None
    elif target == "queued":
        assert report["requeued"] == [tid] and event["type"] == "task.requeued"
        assert event["task"]["status"] == "queued" and task["attempts"] == (1 if state == "queued" else 2)
        assert store.output_text(tid) == ""  # the output restarts
        claim = store.claim("w2", limit=1, lease=30)[0]
        assert claim["task_id"] == tid and claim["resume"] is None and claim["status"] == "queued"
    else:
        assert report["resumed"] == [tid] and event["type"] == "task.resumed"
        assert event["task"]["status"] == "running" and task["attempts"] == 2
        claim = store.claim("w2", limit=1, lease=30)[0]
        assert claim["status"] == "running"
        # token 13 was held back without text: the engine samples it again
        assert claim["resume"] == {"generated": [11, 12], "emitted": "Hel", "kv_path": "snap/1.kv"}
    if state == "running" and target == "running":
        assert report["kv_paths"] == []
    elif state in ("running", "cancelling"):
        assert report["kv_paths"] == ["snap/1.kv"]
    assert store.recover(startup=True)["failed"] == []  # nothing left to do for this task twice
    assert_gapless(store, tid)


def test_requeued_task_runs_again_from_scratch(store, make_task):
    tid = put_in_state(store, make_task, "running", "retry")
    store.recover()
    store.claim("w2", limit=1, lease=30)
    store.set_running(tid, "w2")
    store.append_step("w2", [{"task_id": tid, "delta": "New", "tokens": [1], "finish": "stop"}])
    assert store.output_text(tid) == "New"
    response = store.get_response(store.get_task(tid)["response_id"])
    assert response["output"][0]["content"][0]["text"] == "New"
    types = event_types(store, tid)
    assert types.count("response.output_item.added") == 2  # once per attempt
    assert_consistent(store, tid)


def test_resumed_task_carries_on(store, make_task):
    tid = put_in_state(store, make_task, "running", "resume")
    store.recover()
    store.claim("w2", limit=1, lease=30)
    before = store.last_sequence(tid)
    store.set_running(tid, "w2")
    assert store.last_sequence(tid) == before
    store.append_step("w2", [{"task_id": tid, "delta": "lo", "tokens": [14], "finish": "stop"}])
    assert store.output_text(tid) == "Hello"
    types = event_types(store, tid)
    assert types.count("response.output_item.added") == 1
    deltas = "".join(e["delta"] for e in all_events(store, tid) if e["type"] == "response.output_text.delta")
    response = store.get_response(store.get_task(tid)["response_id"])
    assert deltas == "Hello" == response["output"][0]["content"][0]["text"]
    assert_consistent(store, tid)


def test_cancel_of_a_waiting_resumed_task_is_immediate(store, make_task):
    tid = put_in_state(store, make_task, "running", "resume")
    store.recover()
    assert store.cancel(tid)["status"] == "cancelled"
    assert store.claim("w2", limit=1, lease=30) == []
    assert_consistent(store, tid)


def test_dead_worker_recovery_only_touches_expired_leases(store, make_task, clock):
    dead = make_task("retry")["task"]["id"]
    store.claim("dead", limit=1, lease=10)
    store.set_running(dead, "dead")
    alive = make_task("fail")["task"]["id"]
    store.claim("alive", limit=1, lease=10)
    store.set_running(alive, "alive")
    waiting = make_task("fail")["task"]["id"]
    clock.advance(5)
    assert store.recover(startup=False)["requeued"] == []
    store.renew("alive", lease=10)
    clock.advance(6)
    report = store.recover(startup=False)
    assert report == {"failed": [], "requeued": [dead], "resumed": [], "cancelled": [], "exhausted": [], "kv_paths": []}
    assert store.get_task(alive)["status"] == "running"
    assert store.get_task(waiting)["status"] == "queued"
    assert store.get_task(dead)["status"] == "queued"
    # the dead worker's late write is refused and changes nothing
    result = store.append_step("dead", [{"task_id": dead, "delta": "zombie", "tokens": [1], "finish": "stop"}])
    assert result["skipped"] == [dead] and store.output_text(dead) == ""


def test_release_returns_unstarted_claims_and_leaves_the_rest_to_recovery(store, make_task, clock):
    started = make_task("fail")["task"]["id"]
    unstarted = make_task("fail")["task"]["id"]
    store.claim("w1", limit=2, lease=60)
    store.set_running(started, "w1")
    store.release("w1")
    assert [c["task_id"] for c in store.claim("w2", limit=5, lease=60)] == [unstarted]
    report = store.recover(startup=False)
    assert report["failed"] == [started]
    assert store.get_task(unstarted)["status"] == "queued"


@pytest.mark.parametrize("policy", ["fail", "retry", "resume"])
def test_a_worker_gives_back_its_running_task_by_its_policy_when_its_rpc_server_is_lost(store, make_task, policy):
    tid = put_in_state(store, make_task, "running", policy)
    other = put_in_state(store, make_task, "queued", policy)  # not started: not this worker's to give back
    message = "RPC server 10.0.0.3:50052 lost: it closed the connection"
    report = store.give_back("w1", [tid, other], code="backend_lost", message=message, max_attempts=3)
    task = store.get_task(tid)
    assert task["status"] == SPEC_RECOVERY[("running", policy)]
    assert_gapless(store, tid)
    assert_consistent(store, tid)
    assert store.get_task(other)["status"] == "queued"
    if policy == "fail":
        assert report["failed"] == [tid]
        assert task["error"] == {"code": "backend_lost", "message": message}
        assert event_types(store, tid)[-1] == "response.failed"
    else:
        assert report["requeued" if policy == "retry" else "resumed"] == [tid]
        assert task["attempts"] == 2  # the start the lost server cut short counts


def test_a_task_given_back_once_too_often_fails_with_attempts_exhausted(store, make_task):
    tid = put_in_state(store, make_task, "running", "retry")
    report = store.give_back("w1", [tid], code="backend_lost", message="lost", max_attempts=1)
    assert report["exhausted"] == [tid]
    assert store.get_task(tid)["error"]["code"] == "attempts_exhausted"


def test_release_of_named_claims_leaves_the_others(store, make_task, clock):
    """A worker that began to drain while it claimed gives those claims back at once; its
    other tasks, and other workers' claims, stay as they are."""
    started, given, kept = (make_task("fail")["task"]["id"] for _ in range(3))
    store.claim("w1", limit=3, lease=60)
    store.set_running(started, "w1")
    store.release("w2", [given])  # not w2's
    store.release("w1", [started, given])
    assert [c["task_id"] for c in store.claim("w2", limit=5, lease=60)] == [given]
    with store._db.read() as conn:
        assert [store._task(conn, t)["owner"] for t in (started, given, kept)] == ["w1", "w2", "w1"]
    assert store.recover(startup=False)["failed"] == [started]  # its lease expired: recovery's
