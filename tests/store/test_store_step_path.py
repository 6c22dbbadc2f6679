"""append_step's fast path: a known task's events go in at the numbers after the last one
this process wrote, with no read of the task rows; a foreign change (which always writes an
event) sends the step back to the rows, and every delta is written exactly once."""
from __future__ import annotations

import importlib.util
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from lmsp.contracts import StepState
from lmsp.store import Store, steps
from store_checks import assert_consistent, event_types

VARIANTS = Path(__file__).resolve().parents[2] / "bench" / "variants.py"


@pytest.fixture
def checked_steps(monkeypatch) -> list:
    """A list that grows by one per step that went through ``_write_from_rows`` (the rows)
    instead of the fast path."""
    calls: list = []
    checked = Store._write_from_rows

    def spy(self, *args, **kwargs):
        calls.append(args[2])  # the items
        return checked(self, *args, **kwargs)

    monkeypatch.setattr(Store, "_write_from_rows", spy)
    return calls


def step(store: Store, tids: list[str], n: int, owner: str = "w1") -> dict:
    return store.append_step(owner, [{"task_id": t, "delta": f"<{t[-3:]}:{n}>", "tokens": [n]} for t in tids])


def expected_text(tid: str, steps) -> str:
    return "".join(f"<{tid[-3:]}:{n}>" for n in steps)


def test_known_tasks_take_the_fast_path(store, running_task, checked_steps):
    tids = [running_task() for _ in range(5)]
    step(store, tids, 0)
    assert len(checked_steps) == 1  # the first step reads the rows
    for n in (1, 2, 3):
        step(store, tids, n)
    # a step that changes more than the counter: pending tokens, a snapshot path
    store.append_step("w1", [{"task_id": tids[0], "delta": "", "tokens": [7, 8]},
                             {"task_id": tids[1], "delta": "+", "tokens": [9], "kv_path": "snap/1.kv"}]
                      + [{"task_id": t, "delta": "+", "tokens": [9]} for t in tids[2:]])
    step(store, tids, 4)
    assert len(checked_steps) == 1, "known tasks must not be read again"
    for i, tid in enumerate(tids):
        text = expected_text(tid, range(4)) + ("" if i == 0 else "+") + expected_text(tid, [4])
        assert store.output_text(tid) == text
        assert_consistent(store, tid)
    last = store.events(tids[0], after=store.last_sequence(tids[0]) - 1)["data"][0]
    assert last["delta"] == f"<{tids[0][-3:]}:4>"


def test_the_usual_step_is_made_in_one_pass(store, running_task, monkeypatch):
    """A step in which every task adds one more delta to its open item builds its rows
    in one pass; one that holds a token back (no text) takes the general fast path,
    and both write the same events a read of the rows would."""
    tids = [running_task() for _ in range(3)]
    step(store, tids, 0)  # opens the items
    general: list = []
    known_step = steps.known_step

    def spy(owner, items, known, now):
        general.append([item["task_id"] for item in items])
        return known_step(owner, items, known, now)

    monkeypatch.setattr(steps, "known_step", spy)
    outcome = store.append_step("w1", [{"task_id": t, "delta": "a", "tokens": [1]} for t in tids], with_events=True)
    assert general == []
    assert outcome["skipped"] == [] and outcome["finished"] == {}
    store.append_step("w1", [{"task_id": tids[0], "delta": "", "tokens": [2]}]
                      + [{"task_id": t, "delta": "b", "tokens": [2]} for t in tids[1:]])
    assert general == [tids]
    step(store, tids, 3)  # tids[0] holds a token back: its row changes, not the one-pass kind
    assert len(general) == 2
    step(store, tids, 4)
    assert len(general) == 2
    for i, tid in enumerate(tids):
        assert store.output_text(tid) == expected_text(tid, [0]) + "a" + ("" if i == 0 else "b") \
            + expected_text(tid, [3, 4])
        assert_consistent(store, tid)
    delta = store.events(tids[0], after=store.last_sequence(tids[0]) - 2)["data"][0]
    assert delta["delta"] == f"<{tids[0][-3:]}:3>"


def test_a_foreign_event_in_one_task_redoes_the_whole_step_once(store, running_task, db_path, clock,
                                                                  checked_steps):
    tids = [running_task() for _ in range(5)]
    step(store, tids, 0)
    step(store, tids, 1)
    other = Store.open(db_path, clock=clock)  # another process, in effect
    try:
        other.cancel(tids[3])  # task.cancelling: a foreign event, a new last_seq
        before = len(checked_steps)
        result = step(store, tids, 2)
        assert len(checked_steps) == before + 1  # rolled back, redone from the rows
        assert result == {"skipped": [], "cancelled": [], "finished": {}}
        step(store, tids, 3)
        assert len(checked_steps) == before + 1  # and fast again afterwards
    finally:
        other.close()
    for tid in tids:
        assert store.output_text(tid) == expected_text(tid, range(4))  # every delta exactly once
        assert_consistent(store, tid)
    assert event_types(store, tids[3])[-3:] == ["task.cancelling", "response.output_text.delta",
                                                 "response.output_text.delta"]


def test_a_lost_claim_is_caught_although_no_event_marks_it(store, running_task, db_path, clock, checked_steps):
    lost = running_task("resume")  # lease until t+30
    clock.advance(20)
    kept = [running_task() for _ in range(3)]  # leases until t+50
    tids = [lost, *kept]
    step(store, tids, 0)
    step(store, tids, 1)
    clock.advance(11)
    other = Store.open(db_path, clock=clock)  # another process, in effect
    try:
        assert other.recover(startup=False)["resumed"] == [lost]  # task.resumed, owner cleared
        step(store, kept, 2)  # the other tasks are still w1's, fast
        before = len(checked_steps)
        assert [c["task_id"] for c in other.claim("w2", limit=10, lease=30)] == [lost]  # no event
        result = step(store, tids, 3)
        assert len(checked_steps) == before + 1
        assert result["skipped"] == [lost]
        step(store, kept, 4)
        assert len(checked_steps) == before + 1
        step(store, [lost], 5, owner="w2")
    finally:
        other.close()
    assert store.output_text(lost) == expected_text(lost, [0, 1, 5])  # resumed: w2 continues, w1 wrote no more
    for tid in kept:
        assert store.output_text(tid) == expected_text(tid, range(5))
    for tid in tids:
        assert_consistent(store, tid)


def test_a_task_row_change_checks_the_counter_too(store, running_task, db_path, clock, checked_steps):
    """A step that changes a row but writes no event for it (a token whose text is held back)
    has no event number to collide on: its guarded update catches the foreign event."""
    tids = [running_task() for _ in range(3)]
    step(store, tids, 0)
    step(store, tids, 1)
    other = Store.open(db_path, clock=clock)
    try:
        other.cancel(tids[0])  # task.cancelling
    finally:
        other.close()
    before = len(checked_steps)
    store.append_step("w1", [{"task_id": tids[0], "delta": "", "tokens": [77]}]
                      + [{"task_id": t, "delta": "x", "tokens": [2]} for t in tids[1:]])
    assert len(checked_steps) == before + 1
    step(store, tids, 3)
    conn = sqlite3.connect(db_path)
    try:
        delta = conn.execute("SELECT tokens FROM task_events WHERE task_id = ? ORDER BY seq DESC LIMIT 1",
                             (tids[0],)).fetchone()[0]
    finally:
        conn.close()
    assert delta == "77,3"  # the held-back token was kept, and went out with the next text
    for tid in tids:
        assert_consistent(store, tid)


def test_every_way_a_running_task_leaves_its_owner_writes_an_event(store, running_task, db_path, clock):
    """The fast path's guard is the events' key: it holds because nothing takes a running task
    from its owner without an event. Each way the store has of doing so, checked."""
    def counter(tid: str) -> int:
        return store.last_sequence(tid)

    for policy in ("fail", "retry", "resume"):
        tid = running_task(policy)
        step(store, [tid], 0)
        before = counter(tid)
        clock.advance(31)  # past the lease
        store.recover(startup=False)
        assert counter(tid) > before, policy
        before = counter(tid)
        if policy == "resume":  # unowned and running: claimable, and then stepped by w2
            assert tid in [c["task_id"] for c in store.claim("w2", limit=10, lease=30)]
            step(store, [tid], 1, owner="w2")
            assert counter(tid) > before
    tid = running_task("retry")
    step(store, [tid], 0)
    before = counter(tid)
    store.release("w1")  # a graceful stop keeps the owner, with an expired lease
    assert store.get_task(tid)["status"] == "running" and counter(tid) == before
    store.recover(startup=True)
    assert counter(tid) > before
    for cancel_or_fail in ("cancel", "fail"):
        tid = running_task()
        step(store, [tid], 0)
        before = counter(tid)
        if cancel_or_fail == "cancel":
            store.cancel(tid)
        else:
            store.fail_task(tid, "w1", code="server_error", message="x")
        assert counter(tid) > before


def _as_read(store: Store, written: dict) -> dict:
    """append_step's events, as the event objects a read of the store returns."""
    from lmsp.objects import event_object

    return {tid: [event_object(dict(zip(Store.EVENT_ROW, row)), item_id) for row in rows]
            for tid, (item_id, rows) in written.items()}


def test_with_events_returns_exactly_the_rows_a_read_returns(store, running_task, db_path, clock, checked_steps):
    tids = [running_task() for _ in range(4)]
    seen = {tid: store.last_sequence(tid) for tid in tids}

    def check(outcome: dict, running: list[str]) -> None:
        got = _as_read(store, outcome["events"])
        assert sorted(got) == sorted(running)
        for tid in running:
            assert got[tid] == store.events(tid, after=seen[tid])["data"]  # everything, nothing more
            seen[tid] = store.last_sequence(tid)

    # the first step (the rows: output_item and content_part open, then the delta)
    check(store.append_step("w1", [{"task_id": t, "delta": "a", "tokens": [1]} for t in tids],
                            with_events=True), tids)
    # the fast path, several steps of one task in one transaction, a step without text
    outcome = store.append_step("w1", [{"task_id": tids[0], "delta": "b", "tokens": [2]},
                                       {"task_id": tids[0], "delta": "", "tokens": [3]},
                                       {"task_id": tids[0], "delta": "c", "tokens": [4]},
                                       {"task_id": tids[1], "delta": "", "tokens": [5]}], with_events=True)
    assert len(checked_steps) == 1
    check(outcome, [tids[0]])  # tids[1] wrote no event
    assert [e["delta"] for e in store.events(tids[0], after=seen[tids[0]] - 2)["data"]] == ["b", "c"]
    # a step that ends one task and skips one that is no longer ours: neither is in it
    other = Store.open(db_path, clock=clock)
    try:
        other.cancel(tids[2])
    finally:
        other.close()
    before_cancel, seen[tids[2]] = seen[tids[2]], store.last_sequence(tids[2])  # task.cancelling: not ours
    outcome = store.append_step("w1", [{"task_id": tids[0], "delta": "d", "tokens": [6]},
                                       {"task_id": tids[1], "delta": "e", "tokens": [7], "finish": "stop"},
                                       {"task_id": tids[2], "delta": "f", "tokens": [8]},
                                       {"task_id": tids[3], "delta": "g", "tokens": [9]}], with_events=True)
    assert outcome["finished"] == {tids[1]: "completed"}
    assert outcome["events"][tids[2]][1][0][0] == before_cancel + 2  # the foreign event is not in it
    check(outcome, [tids[0], tids[2], tids[3]])  # a cancelling task still runs until the engine stops it
    assert "events" not in step(store, [tids[0]], 1)  # only when asked
    for tid in tids:
        assert_consistent(store, tid)


def test_only_new_and_ending_tasks_go_through_their_rows(store, running_task, checked_steps):
    """A step of tasks this process stepped before, one it has not and one that ends: the
    first take the fast path, the two others are read, in the same transaction."""
    tids = [running_task() for _ in range(4)]
    step(store, tids, 0)
    new = running_task()  # claimed and started, never stepped here
    seen = {tid: store.last_sequence(tid) for tid in [*tids, new]}
    before = len(checked_steps)
    items = [{"task_id": t, "delta": f"<{t[-3:]}:1>", "tokens": [1]} for t in tids[:3]]
    items += [{"task_id": tids[3], "delta": "", "tokens": [], "finish": "stop"},
              {"task_id": new, "delta": "first", "tokens": [9]}]
    outcome = store.append_step("w1", items, with_events=True)
    assert len(checked_steps) == before + 1
    assert sorted(item["task_id"] for item in checked_steps[-1]) == sorted([tids[3], new])
    assert outcome["finished"] == {tids[3]: "completed"} and outcome["skipped"] == []
    got = _as_read(store, outcome["events"])
    assert sorted(got) == sorted([*tids[:3], new])
    for tid in got:
        assert got[tid] == store.events(tid, after=seen[tid])["data"]
    step(store, [*tids[:3], new], 2)
    assert len(checked_steps) == before + 1  # all known now
    for tid in tids[:3]:
        assert store.output_text(tid) == expected_text(tid, range(3))
    assert store.output_text(new) == "first" + expected_text(new, [2])
    assert store.get_task(tids[3])["status"] == "completed"
    for tid in [*tids, new]:
        assert_consistent(store, tid)


def test_a_task_created_claimed_takes_the_fast_path_from_its_first_step(store, db_path, clock, checked_steps):
    def create() -> tuple[str, int]:
        out = store.create_task(client_id=None, model="m", request={"input": "x"}, on_restart="fail",
                                background=False, stream=True, claim=("w1", 30.0))
        assert out["claim"] is not None
        return out["task"]["id"], store.last_sequence(out["task"]["id"])

    tid, created = create()
    outcome = store.append_step("w1", [{"task_id": tid, "delta": "Hi", "tokens": [5]}], with_events=True)
    assert checked_steps == []
    assert _as_read(store, outcome["events"])[tid] == store.events(tid, after=created)["data"]
    assert event_types(store, tid)[-3:] == ["response.output_item.added", "response.content_part.added",
                                            "response.output_text.delta"]
    # a change by anyone else before the first step: the fast insert collides, the rows decide
    other_tid, _ = create()
    other = Store.open(db_path, clock=clock)  # another process, in effect
    try:
        other.cancel(other_tid)
    finally:
        other.close()
    outcome = store.append_step("w1", [{"task_id": tid, "delta": " there", "tokens": [6]},
                                       {"task_id": other_tid, "delta": "Hi", "tokens": [5]}])
    assert len(checked_steps) == 1  # rolled back once, redone from the rows
    assert store.output_text(tid) == "Hi there" and store.output_text(other_tid) == "Hi"
    assert event_types(store, other_tid)[-4:] == ["task.cancelling", "response.output_item.added",
                                                  "response.content_part.added", "response.output_text.delta"]
    for t in (tid, other_tid):
        assert_consistent(store, t)


@pytest.mark.parametrize("policy", ["resume", "retry"])
def test_an_item_of_an_earlier_claim_is_skipped(store, running_task, clock, policy):
    """Recovered from w1 (its lease ran out) and claimed by w1 again: what w1's old run
    still sends for the task is not this claim's output, and is refused."""
    tid = running_task(policy)
    first = store.get_task(tid)["attempts"]
    store.append_step("w1", [{"task_id": tid, "attempt": first, "delta": "old", "tokens": [1]}])
    report = store.recover(startup=False, now=clock() + 3600)
    assert tid in report["resumed"] + report["requeued"]
    (claim,) = [c for c in store.claim("w1", limit=10, lease=30) if c["task_id"] == tid]
    if policy == "retry":
        store.set_running(tid, "w1")
    assert claim["attempts"] == first + 1
    out = store.append_step("w1", [{"task_id": tid, "attempt": first, "delta": "stale", "tokens": [2]}])
    assert out["skipped"] == [tid]
    out = store.append_step("w1", [{"task_id": tid, "attempt": first + 1, "delta": "new", "tokens": [3]}])
    assert out["skipped"] == []
    text = store.output_text(tid)
    assert "stale" not in text and text.endswith("new")
    assert_consistent(store, tid)


def written_state(db_path, task_id: str) -> StepState:
    """The state a task's rows in the file hold: where its next step continues from."""
    with closing(sqlite3.connect(db_path)) as conn:
        row = conn.execute(
            "SELECT t.owner, (SELECT coalesce(max(seq), 0) FROM task_events e WHERE e.task_id = t.id),"
            " t.item_open, t.pending_tokens, t.kv_path, r.item_id"
            " FROM tasks t JOIN responses r ON r.id = t.response_id WHERE t.id = ?",
            (task_id,),
        ).fetchone()
    return StepState(*row)


def test_step_events_are_the_rows_and_state_append_step_leaves(store, running_task, db_path):
    """bench/variants.py's step_events shows one item's events before they are written:
    the same rows, at the same numbers, and the same next state as append_step writing
    that item."""
    spec = importlib.util.spec_from_file_location("bench_variants", VARIANTS)
    variants = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(variants)
    step_events = variants.step_events
    tids = [running_task() for _ in range(2)]
    now = store._clock()
    items = [{"task_id": tids[0], "delta": "a", "tokens": [1]},  # opens the item: three events
             {"task_id": tids[0], "delta": "", "tokens": [2]},  # a token held back: no event
             {"task_id": tids[0], "delta": "b", "tokens": [3], "kv_path": "snap/1.kv"}]
    state = written_state(db_path, tids[0])
    assert state.owner == "w1" and state.item_open == 0
    for item in items:
        before = store.last_sequence(tids[0])
        state, rows = step_events("w1", item, state, now)
        outcome = store.append_step("w1", [item], with_events=True)
        assert rows == outcome["events"].get(tids[0], (None, []))[1]
        assert [row[0] for row in rows] == list(range(before + 1, store.last_sequence(tids[0]) + 1))
        assert state == written_state(db_path, tids[0])
    assert state.pending_tokens == "" and state.kv_path == "snap/1.kv"
    with pytest.raises(ValueError):
        step_events("w1", {"task_id": tids[1], "delta": "x", "finish": "stop"}, written_state(db_path, tids[1]), now)
