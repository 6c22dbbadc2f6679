"""Sharing the box between clients (lmsp.store.sharing): tasks start in a fair order,
a queued task knows its place, a client's limits and quota hold in the transaction
that creates a task, and every finished task's tokens count for its client's hour."""
from __future__ import annotations

import pytest

from lmsp.errors import InvalidRequest, NotFound, QuotaExceeded, RateLimited
from lmsp.store import Store


def client(store: Store, name: str, **limits) -> str:
    cid = store.create_client(name=name, scopes=["responses:write"], token_hash=f"hash-{name}")["id"]
    if limits:
        store.set_limits(cid, **limits)
    return cid


def queue(make_task, cid: str | None, n: int, **kw) -> list[str]:
    return [make_task(client_id=cid, **kw)["task"]["id"] for _ in range(n)]


def start_order(store: Store, n: int) -> list[str]:
    """The next ``n`` tasks a worker claims, one free slot at a time."""
    return [store.claim("w1", limit=1, lease=30)[0]["task_id"] for _ in range(n)]


def test_a_clients_first_task_waits_behind_at_most_one_of_anothers(store, make_task):
    a, b = client(store, "a"), client(store, "b")
    first = queue(make_task, a, 2)
    started = start_order(store, 2)  # a's two running: the queue is empty
    assert started == first
    backlog = queue(make_task, a, 40)
    (late,) = queue(make_task, b, 1)
    order = start_order(store, 5)
    assert order.index(late) <= 1  # before a's fifth task, and its third waiting
    assert [t for t in order if t != late] == backlog[:4]


def test_priorities_share_the_starts_in_their_ratio(store, make_task):
    a, b = client(store, "a", priority=2), client(store, "b")
    mine, theirs = set(queue(make_task, a, 40)), set(queue(make_task, b, 40))
    order = start_order(store, 30)
    assert abs(sum(t in mine for t in order) - 20) <= 1 and abs(sum(t in theirs for t in order) - 10) <= 1


def test_a_task_to_resume_keeps_its_place(store, make_task):
    """A running task whose worker is gone is claimed again in its own turn: it was made first."""
    a = client(store, "a")
    (old,) = queue(make_task, a, 1, on_restart="resume")
    store.claim("w0", limit=1, lease=30)
    store.set_loading(old, "w0")
    store.set_running(old, "w0")
    later = queue(make_task, a, 2, on_restart="retry")
    store.recover(startup=True)  # w0 is gone: its task waits, unowned, to resume
    assert store.get_task(later[0])["queue_position"] == 2
    assert start_order(store, 3) == [old, *later]


def test_a_queued_task_knows_its_place_and_the_queue_lists_in_start_order(store, make_task):
    a, b = client(store, "a"), client(store, "b")
    mine = queue(make_task, a, 3)
    theirs = queue(make_task, b, 2, model="other")
    expected = [mine[0], theirs[0], mine[1], theirs[1], mine[2]]
    assert [store.get_task(t)["queue_position"] for t in expected] == [1, 2, 3, 4, 5]
    assert [store.get_task(t)["queued_ahead"] for t in expected] == [0, 0, 1, 1, 2]
    page = store.list_tasks(status="queued", limit=2)
    assert [t["id"] for t in page["data"]] == expected[:2] and page["has_more"]
    rest = store.list_tasks(status="queued", limit=10, after=page["last_id"])
    assert [t["id"] for t in rest["data"]] == expected[2:]
    response = store.get_response(store.get_task(mine[1])["response_id"])
    assert response["task"]["queue_position"] == 3
    (claimed,) = store.claim("w1", limit=1, lease=30)
    assert "queue_position" not in store.get_task(claimed["task_id"])
    assert store.get_task(theirs[0])["queue_position"] == 1


def test_max_queued_refuses_the_next_task_of_that_client_only(store, make_task):
    a, b = client(store, "a", max_queued=2), client(store, "b")
    queue(make_task, a, 2)
    with pytest.raises(RateLimited) as refused:
        make_task(client_id=a)
    assert refused.value.code == "rate_limited" and refused.value.headers["Retry-After"] == "1"
    assert len(store.list_tasks(client_id=a)["data"]) == 2  # nothing stored for the refused one
    queue(make_task, b, 3)
    store.claim("w1", limit=1, lease=30)  # a's first is claimed: still queued, not started
    with pytest.raises(RateLimited):
        make_task(client_id=a)


def test_max_running_leaves_a_clients_other_tasks_waiting(store, make_task):
    a, b = client(store, "a", max_running=1), client(store, "b")
    mine, theirs = queue(make_task, a, 3), queue(make_task, b, 2)
    claimed = [c["task_id"] for c in store.claim("w1", limit=10, lease=30)]
    assert claimed == [mine[0], *theirs]
    store.set_loading(mine[0], "w1")
    store.set_running(mine[0], "w1")
    assert store.claim("w1", limit=10, lease=30) == []
    store.append_step("w1", [{"task_id": mine[0], "attempt": 1, "delta": "x", "tokens": [1], "finish": "stop",
                               "usage": {"input_tokens": 5, "output_tokens": 1}}])
    assert [c["task_id"] for c in store.claim("w1", limit=10, lease=30)] == [mine[1]]


def test_a_clients_quota_of_tokens_holds_for_the_hour(store, make_task, clock):
    clock.now = 3600 * 500_000 + 10.0
    a = client(store, "a", tokens_per_hour=10)
    (tid,) = queue(make_task, a, 1)
    store.claim("w1", limit=1, lease=30)
    store.set_loading(tid, "w1")
    store.set_running(tid, "w1")
    store.append_step("w1", [{"task_id": tid, "attempt": 1, "delta": "x", "tokens": [1], "finish": "stop",
                               "usage": {"input_tokens": 9, "output_tokens": 3}}])
    assert store.usage([a]) == [{"client_id": a, "hour_start": 3600 * 500_000, "tasks": 1, "tokens": 12}]
    with pytest.raises(QuotaExceeded) as refused:
        make_task(client_id=a)
    assert refused.value.code == "quota_exceeded" and refused.value.status == 429
    assert refused.value.headers["Retry-After"] == str(3600 - 10)
    clock.advance(3600)
    make_task(client_id=a)  # a new hour


def test_limits_hold_for_every_worker_of_the_database(db_path, clock, make_task, store):
    a = client(store, "a", max_queued=3)
    other = Store.open(db_path, clock=clock)
    try:
        for s in (store, other, store):
            s.create_task(client_id=a, model="tiny", request={"input": "x"}, on_restart="fail", background=True,
                          stream=False)
        with pytest.raises(RateLimited):
            other.create_task(client_id=a, model="tiny", request={"input": "x"}, on_restart="fail",
                              background=True, stream=False)
    finally:
        other.close()


def test_limits_are_set_checked_and_shown(store):
    a = client(store, "a")
    assert store.client_limits(a) == {"priority": 1, "max_running": None, "max_queued": None,
                                      "tokens_per_hour": None}
    assert store.set_limits(a, priority=3, max_queued=5)["priority"] == 3
    assert next(c for c in store.list_clients() if c["id"] == a)["max_queued"] == 5
    assert store.set_limits(a, max_queued=None)["max_queued"] is None
    for bad in ({"priority": 0}, {"priority": 101}, {"priority": None}, {"max_running": -1},
                {"max_queued": True}, {"bogus": 1}):
        with pytest.raises(InvalidRequest):
            store.set_limits(a, **bad)
    with pytest.raises(NotFound):
        store.set_limits("cli_nobody", priority=2)
