"""Chains of responses in the store: each turn kept once by reference, read back
whenever a task is claimed, and retention counted from a chain's newest response."""

from __future__ import annotations

import json
import sqlite3

import pytest

from lmsp.errors import NotFound
from lmsp.store import Store, retention


def said(text: str) -> list[dict]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]


@pytest.fixture
def chain(store: Store, make_task):
    """``chain(text, previous=None)``: a response of ``text`` continuing ``previous`` as the
    web layer asks for it (the previous turn named, its messages when not kept yet),
    claimed, run to its end; returns its response id."""

    def make(text: str, previous: str | None = None, policy: str = "fail", finish: bool = True) -> str:
        request: dict = {"model": "tiny", "input": text}
        if previous is not None:
            kept = store.chain_context(previous)
            parent = store.get_request(previous).get("previous_response_id") if kept is None else None
            turn = {"response_id": previous}
            if kept is None:
                turn.update(parent=parent, messages=said(store.get_request(previous)["input"]), calls={})
            before = (store.chain_context(parent) or ([], {}))[0] if parent else []
            request.update(previous_response_id=previous, context=(kept or (before + turn["messages"], {}))[0])
            request["chain_turn"] = turn
        tid = make_task(policy, request=request)["task"]["id"]
        if finish:
            assert tid in [c["task_id"] for c in store.claim("w1", limit=100, lease=30)]
            store.set_running(tid, "w1")
            store.append_step("w1", [{"task_id": tid, "delta": "ok", "tokens": [1], "finish": "stop"}])
        return store.get_task(tid)["response_id"]

    return make


def stored(db_path, rid: str) -> dict:
    with sqlite3.connect(db_path) as conn:
        return json.loads(conn.execute("SELECT request FROM responses WHERE id = ?", (rid,)).fetchone()[0])


def test_a_continuation_keeps_its_context_by_reference(store, chain, db_path):
    first = chain("one")
    second = chain("two", first)
    third = chain("three", second)
    for rid in (second, third):
        assert "context" not in stored(db_path, rid) and "chain_turn" not in stored(db_path, rid)
    assert store.chain_context(second) == (said("one") + said("two"), {})
    assert store.chain_context(third) is None  # not continued yet
    store.delete_response(first)  # DELETE goes at once; the turns stay
    store.delete_response(second)
    chain("four", third)
    assert store.chain_context(third) == (said("one") + said("two") + said("three"), {})


@pytest.mark.parametrize("policy", ["resume", "retry"])
def test_a_restarted_task_reads_the_same_context(store, chain, policy):
    first = chain("one")
    second = chain("two", first)
    rid = chain("three", second, policy, finish=False)
    [claimed] = store.claim("w1", limit=10, lease=30)
    store.set_running(claimed["task_id"], "w1")
    store.delete_response(first)
    store.recover(startup=True)  # the worker died
    [again] = store.claim("w2", limit=10, lease=30)
    assert again["response_id"] == rid and again["request"] == claimed["request"]
    assert again["request"]["context"] == said("one") + said("two")


def test_a_chain_is_kept_until_its_newest_response_expires(store, chain, clock):
    first = chain("one")
    second = chain("two", first)
    clock.advance(3600)
    third = chain("three", second)
    assert store.gc(retention=1800)["tasks"] == 0
    clock.advance(1000)
    assert store.gc(retention=1800)["tasks"] == 0
    clock.advance(1000)
    assert store.gc(retention=1800)["tasks"] == 3  # all of it, at once
    for rid in (first, second, third):
        with pytest.raises(NotFound):
            store.get_response(rid)
        assert store.chain_context(rid) is None


def test_an_unfinished_response_keeps_its_chain(store, chain, clock):
    first = chain("one")
    running = chain("two", first, finish=False)
    clock.advance(10 * 86400)
    assert store.gc(retention=1800)["tasks"] == 0  # in use: its time is now
    clock.advance(1000)
    assert store.gc(retention=1800)["tasks"] == 0
    store.cancel(running)
    clock.advance(3600)
    assert store.gc(retention=1800)["tasks"] == 2


def test_a_chain_taken_by_retention_cannot_be_joined(store, chain, clock, make_task):
    first = chain("one")
    second = chain("two", first)
    parent_turn = {"response_id": second, "parent": first, "messages": said("two"), "calls": {}}
    clock.advance(3600)
    store.gc(retention=1800)
    request = {"model": "tiny", "input": "late", "previous_response_id": second, "chain_turn": parent_turn}
    with pytest.raises(NotFound):
        make_task(request=request)
    assert store.list_tasks()["data"] == []


def test_the_expiry_queries_read_indexes(store, db_path):
    queries = [
        (retention.EXPIRED_TASKS_SQL, (1.0, 5)),
        (retention.EXPIRED_CHAINS_SQL, (1.0, 0.0, "", 5)),
        (retention.CHAIN_TASKS_SQL, ("x",)),
    ]
    with sqlite3.connect(db_path) as conn:
        plans = [" ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, args)) for sql, args in queries]
    assert "INDEX tasks_finished" in plans[0] and "TEMP B-TREE" not in plans[0]
    assert "INDEX chains_newest" in plans[1] and "TEMP B-TREE" not in plans[1]
    assert "INDEX tasks_chain" in plans[2]


def test_deleting_every_response_of_a_chain_deletes_its_turns(store, chain, db_path):
    first = chain("one")
    second = chain("two", first)
    third = chain("three", second)
    for rid in (second, first):
        store.delete_response(rid)
        assert store.chain_context(second) is not None  # the newest still needs them
    store.delete_response(third)
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT count(*) FROM chain_turns").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM chains").fetchone()[0] == 0


def test_a_response_continued_while_retention_reads_it_is_kept_whole(store, chain, clock, monkeypatch):
    first = chain("one")
    task_id = store.get_response(first)["task"]["id"]
    logged = len(store.events(task_id)["data"])
    clock.advance(3600)
    read = store._gc_rows

    def continued_meanwhile(rows, *args):  # between the read of the expired rows and their deletion
        chain("two", first)
        monkeypatch.setattr(store, "_gc_rows", read)
        return read(rows, *args)

    monkeypatch.setattr(store, "_gc_rows", continued_meanwhile)
    assert store.gc(retention=1800, batch=2)["tasks"] == 0  # a small batch: its log in slices
    assert len(store.events(task_id)["data"]) == logged
    assert store.get_response(first)["status"] == "completed"
