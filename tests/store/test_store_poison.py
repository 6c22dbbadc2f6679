"""Poison tasks (LMSP B.12): a task whose worker stops while it runs is started at most
``max_attempts`` times; the restart past that fails it with ``attempts_exhausted``,
whatever its policy, while the 11.3 table applies until then."""
from __future__ import annotations

import pytest

from store_checks import SPEC_RECOVERY, all_events, assert_consistent, event_types

CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def start(store, tid: str, owner: str, state: str = "running") -> None:
    """``owner`` claims the task and starts it: ``loading``, or ``running`` with some output."""
    (claim,) = [c for c in store.claim(owner, limit=10, lease=30) if c["task_id"] == tid]
    if claim["status"] == "running":  # a resumed task: its claim is its start
        store.append_step(owner, [{"task_id": tid, "attempt": claim["attempts"], "delta": "x", "tokens": [7]}])
        return
    store.set_loading(tid, owner)
    if state == "running":
        store.set_running(tid, owner)
        store.append_step(owner, [{"task_id": tid, "attempt": claim["attempts"], "delta": "Hel", "tokens": [11]}])


def recover(store, clock, *, startup: bool, max_attempts: int) -> dict:
    """The next service start, or (``startup=False``) another worker's lease round after the lease ran out."""
    if startup:
        return store.recover(startup=True, max_attempts=max_attempts)
    clock.advance(60)
    return store.recover(startup=False, exclude_owner="survivor", max_attempts=max_attempts)


def assert_exhausted(store, tid: str, before: int, report: dict, attempts: int, limit: int) -> None:
    """Failed with ``attempts_exhausted`` and its ``response.failed``, written with the state."""
    task = store.get_task(tid)
    assert (task["status"], task["attempts"]) == ("failed", attempts)
    assert task["error"]["code"] == "attempts_exhausted"
    assert f"{attempts} starts" in task["error"]["message"] and f"max_attempts ({limit})" in task["error"]["message"]
    assert report["failed"] == [tid] and report["exhausted"] == [tid]
    assert report["requeued"] == report["resumed"] == []
    new = all_events(store, tid)[before:]
    if new[0]["type"] in CLOSING:  # the open output item closed first, incomplete
        assert [e["type"] for e in new[:3]] == CLOSING
        new = new[3:]
    assert [e["type"] for e in new] == ["response.failed"]
    assert "error" not in new[0]
    assert new[0]["response"]["status"] == "failed"
    assert new[0]["response"]["error"] == task["error"]
    assert_consistent(store, tid)


@pytest.mark.parametrize("startup", [True, False], ids=["startup", "lease_expired"])
@pytest.mark.parametrize("found", ["loading", "running"])
@pytest.mark.parametrize("policy", ["retry", "resume"])
def test_a_restarting_task_is_started_max_attempts_times_then_fails(store, make_task, clock, policy, found,
                                                                    startup):
    tid = make_task(policy)["task"]["id"]
    limit = 3
    for attempt in range(1, limit + 1):
        start(store, tid, f"w{attempt}", found)
        assert store.get_task(tid)["attempts"] == attempt
        before = store.last_sequence(tid)
        report = recover(store, clock, startup=startup, max_attempts=limit)
        if attempt == limit:
            assert_exhausted(store, tid, before, report, attempt, limit)
            break
        # attempts remain: the table's row, one more attempt
        task = store.get_task(tid)
        target = SPEC_RECOVERY[(found, policy)]
        assert task["status"] == target and task["attempts"] == attempt + 1 and task["error"] is None
        assert report["failed"] == report["exhausted"] == []
        assert report["requeued" if target == "queued" else "resumed"] == [tid]
        assert event_types(store, tid)[before:] == ["task.requeued" if target == "queued" else "task.resumed"]
    assert store.claim("w9", limit=10, lease=30) == []  # never started again
    assert store.recover(startup=True, max_attempts=limit) == {
        "failed": [], "requeued": [], "resumed": [], "cancelled": [], "exhausted": [], "kv_paths": []}


@pytest.mark.parametrize("startup", [True, False], ids=["startup", "lease_expired"])
@pytest.mark.parametrize("policy", ["fail", "retry", "resume"])
def test_with_one_attempt_every_policy_fails_exhausted(store, make_task, clock, policy, startup):
    """``max_attempts = 1``: no restart at all, ``attempts_exhausted`` whatever the policy
    (``fail`` included, whose row would say ``server_restarted``)."""
    tid = make_task(policy)["task"]["id"]
    start(store, tid, "w1")
    before = store.last_sequence(tid)
    report = recover(store, clock, startup=startup, max_attempts=1)
    assert_exhausted(store, tid, before, report, 1, 1)


@pytest.mark.parametrize("found", ["loading", "running"])
def test_a_fail_task_with_attempts_left_gets_its_row(store, make_task, clock, found):
    tid = make_task("fail")["task"]["id"]
    start(store, tid, "w1", found)
    report = store.recover(startup=True, max_attempts=2)
    task = store.get_task(tid)
    assert task["status"] == "failed" and task["error"]["code"] == "server_restarted"
    assert report["failed"] == [tid] and report["exhausted"] == []


def test_a_snapshot_of_an_exhausted_resume_task_is_handed_back(store, make_task, clock):
    tid = make_task("resume")["task"]["id"]
    start(store, tid, "w1")
    store.append_step("w1", [{"task_id": tid, "attempt": 1, "delta": "", "tokens": [12], "kv_path": "snap/1.kv"}])
    report = store.recover(startup=True, max_attempts=1)
    assert report["exhausted"] == [tid] and report["kv_paths"] == ["snap/1.kv"]


def test_the_failure_and_its_event_are_one_transaction(store, make_task, monkeypatch):
    """The event cannot be written: the task stays as it was found, not failed without its event."""
    tid = make_task("retry")["task"]["id"]
    start(store, tid, "w1")
    found = store.get_task(tid)
    before = all_events(store, tid)

    def broken(*args, **kwargs):
        raise RuntimeError("disk gone")

    monkeypatch.setattr(store, "_emit_response", broken)
    with pytest.raises(RuntimeError, match="disk gone"):
        store.recover(startup=True, max_attempts=1)
    assert store.get_task(tid) == found and all_events(store, tid) == before
    monkeypatch.undo()
    assert store.recover(startup=True, max_attempts=1)["exhausted"] == [tid]


def test_a_task_never_started_keeps_its_attempts_across_restarts(store, make_task, clock):
    """Only a start counts: a queued task (claimed or not) and a resumed one that no worker
    took yet are put back as often as the service restarts, and run in the end."""
    waiting = make_task("retry")["task"]["id"]
    claimed = make_task("resume")["task"]["id"]
    resumed = make_task("resume")["task"]["id"]
    start(store, resumed, "w0")
    store.recover(startup=True)
    assert store.get_task(resumed)["attempts"] == 2  # its one start
    for _ in range(5):
        store.claim("w1", limit=2, lease=30)  # the two queued ones: claimed, not started
        report = store.recover(startup=True)
        assert report["failed"] == [] and report.get("exhausted") in ([], None)
        assert store.get_task(waiting)["attempts"] == 1 and store.get_task(claimed)["attempts"] == 1
        assert store.get_task(resumed)["attempts"] == 2
    assert store.get_task(resumed)["status"] == "running"
    claims = {c["task_id"]: c for c in store.claim("w2", limit=10, lease=30)}
    assert set(claims) == {waiting, claimed, resumed}
    for tid, claim in claims.items():
        if claim["status"] == "queued":
            store.set_running(tid, "w2")
        store.append_step("w2", [{"task_id": tid, "attempt": claim["attempts"], "delta": "!", "tokens": [1],
                                  "finish": "stop"}])
        assert store.get_task(tid)["status"] == "completed"


def test_a_cancelling_task_is_cancelled_whatever_its_attempts(store, make_task):
    tid = make_task("retry")["task"]["id"]
    start(store, tid, "w1")
    store.cancel(tid)
    report = store.recover(startup=True, max_attempts=1)
    assert report["cancelled"] == [tid] and report["exhausted"] == []
    assert store.get_task(tid)["status"] == "cancelled"
