"""Responses, tasks, events, cancel (B.5-B.7) through the Store interface."""
from __future__ import annotations

import sqlite3

import pytest

from lmsp.errors import IllegalTransition, InvalidRequest, NotFound, TaskFinished, TaskUnfinished
from lmsp.store import ClaimLost, StoreError
from store_checks import all_events, assert_consistent, event_types


def test_create_task_writes_response_task_and_two_events(store, make_task, clock):
    created = make_task("retry", request={"model": "tiny", "input": "hi", "max_output_tokens": 9, "seed": 7,
                                          "metadata": {"k": "v"}})
    response, task = created["response"], created["task"]
    assert created["replay"] is None
    assert response["id"].startswith("resp_") and task["id"].startswith("task_")
    assert response["status"] == "queued" and response["output"] == []
    assert response["created_at"] == int(clock.now)
    assert response["max_output_tokens"] == 9 and response["seed"] == 7 and response["metadata"] == {"k": "v"}
    assert response["task"] == {"id": task["id"], "status": "queued", "on_restart": "retry",
                                "queue_position": 1, "queued_ahead": 0}
    assert task["status"] == "queued" and task["attempts"] == 1 and task["last_sequence_number"] == 2
    events = all_events(store, task["id"])
    assert [(e["type"], e["sequence_number"]) for e in events] == [("response.created", 1), ("response.queued", 2)]
    assert events[0]["response"]["status"] == "queued"
    assert store.get_response(response["id"]) == response
    assert store.get_task(task["id"]) == task
    assert store.task_id_for_response(response["id"]) == task["id"]


@pytest.mark.parametrize("bad", [dict(on_restart="never"), dict(request=["not", "a", "dict"]), dict(model=""),
                                 dict(request={"x": object()})])
def test_create_task_rejects_bad_input(make_task, bad):
    on_restart = bad.pop("on_restart", "fail")
    with pytest.raises(InvalidRequest):
        make_task(on_restart, **bad)


def test_other_clients_objects_are_not_found(store, make_task):
    created = make_task(client_id="cli_a")
    rid, tid = created["response"]["id"], created["task"]["id"]
    for call in (lambda: store.get_response(rid, "cli_b"), lambda: store.get_task(tid, "cli_b"),
                 lambda: store.events(tid, client_id="cli_b"), lambda: store.cancel(rid, "cli_b"),
                 lambda: store.delete_response(rid, "cli_b"), lambda: store.task_id_for_response(rid, "cli_b")):
        with pytest.raises(NotFound):
            call()
    assert store.get_task(tid, "cli_a")["id"] == tid
    with pytest.raises(NotFound):
        store.get_response("resp_unknown")
    with pytest.raises(NotFound):
        store.last_sequence("task_unknown")


def test_full_run_events_and_response(store, running_task):
    tid = running_task()
    store.append_step("w1", [{"task_id": tid, "delta": "Hel", "tokens": [5, 6]}])
    store.append_step("w1", [{"task_id": tid, "delta": "", "tokens": [7]}])  # text not complete yet
    result = store.append_step("w1", [{"task_id": tid, "delta": "lo!", "tokens": [8], "finish": "stop",
                                       "usage": {"input_tokens": 4, "output_tokens": 4}}])
    assert result == {"skipped": [], "cancelled": [], "finished": {tid: "completed"}}
    assert event_types(store, tid) == [
        "response.created", "response.queued", "task.running", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert_consistent(store, tid)
    events = all_events(store, tid)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [d["delta"] for d in deltas] == ["Hel", "lo!"]
    assert all(d["output_index"] == 0 and d["content_index"] == 0 and d["item_id"].startswith("msg_") for d in deltas)
    assert events[-1]["response"]["status"] == "completed"
    assert events[2]["task"]["status"] == "running" and events[2]["task"]["last_sequence_number"] == 3
    task = store.get_task(tid)
    assert task["status"] == "completed" and task["finished_at"] is not None and task["started_at"] is not None
    response = store.get_response(task["response_id"])
    assert response["status"] == "completed"
    assert response["output"][0]["content"][0]["text"] == "Hello!" == store.output_text(tid)
    assert response["output"][0]["status"] == "completed"
    assert response["usage"] == {"input_tokens": 4,
                                 "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 4},
                                 "output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 0},
                                 "total_tokens": 8}
    assert response["incomplete_details"] is None and response["error"] is None


def test_length_finish_is_incomplete(store, running_task):
    tid = running_task()
    store.append_step("w1", [{"task_id": tid, "delta": "abc", "tokens": [1], "finish": "length"}])
    response = store.get_response(store.get_task(tid)["response_id"])
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert event_types(store, tid)[-1] == "response.incomplete"
    assert store.get_task(tid)["status"] == "completed"


def test_error_finish_fails_with_the_error(store, running_task):
    tid = running_task()
    store.append_step("w1", [{"task_id": tid, "delta": "a", "tokens": [1]}])
    store.append_step("w1", [{"task_id": tid, "finish": "error", "error": {"code": "engine_error", "message": "boom"}}])
    task = store.get_task(tid)
    assert task["status"] == "failed" and task["error"] == {"code": "engine_error", "message": "boom"}
    response = store.get_response(task["response_id"])
    assert response["status"] == "failed" and response["error"]["code"] == "engine_error"
    failed = all_events(store, tid)[-1]
    assert failed["type"] == "response.failed" and "error" not in failed  # B.6: only in response.error
    assert failed["response"]["error"] == {"code": "engine_error", "message": "boom"}
    assert_consistent(store, tid)


def test_in_progress_response_shows_partial_output(store, running_task):
    tid = running_task()
    store.append_step("w1", [{"task_id": tid, "delta": "par", "tokens": [1]}])
    response = store.get_response(store.get_task(tid)["response_id"])
    assert response["status"] == "in_progress"
    assert response["output"][0]["status"] == "in_progress"
    assert response["output"][0]["content"][0]["text"] == "par"


def test_one_step_carries_many_tasks(store, make_task):
    tids = [make_task()["task"]["id"] for _ in range(5)]
    store.claim("w1", limit=10, lease=30)
    for tid in tids:
        store.set_running(tid, "w1")
    for step in range(3):
        finish = "stop" if step == 2 else None
        store.append_step("w1", [{"task_id": t, "delta": f"{i}{step} ", "tokens": [step], "finish": finish}
                                 for i, t in enumerate(tids)])
    for i, tid in enumerate(tids):
        assert store.output_text(tid) == f"{i}0 {i}1 {i}2 "
        assert store.get_task(tid)["status"] == "completed"
        assert_consistent(store, tid)


def test_append_step_skips_tasks_not_owned_or_not_running(store, make_task, running_task):
    mine = running_task()
    queued = make_task()["task"]["id"]
    other = make_task()["task"]["id"]
    store.claim("w2", limit=1, lease=30)  # takes `queued`... oldest first
    store.set_running(queued, "w2")
    before = store.last_sequence(queued)
    result = store.append_step("w1", [{"task_id": mine, "delta": "x", "tokens": [1]},
                                      {"task_id": queued, "delta": "y", "tokens": [2]},
                                      {"task_id": other, "delta": "z", "tokens": [3]},
                                      {"task_id": "task_nope", "delta": "z"}])
    assert result["skipped"] == [queued, other, "task_nope"]
    assert store.last_sequence(queued) == before
    assert store.output_text(mine) == "x"
    with pytest.raises(ValueError):
        store.append_step("w1", [{"task_id": mine, "finish": "exploded"}])


def test_last_sequences_reads_many_counters_at_once(store, make_task, running_task):
    queued = make_task()["task"]["id"]
    running = running_task()
    store.append_step("w1", [{"task_id": running, "delta": "a", "tokens": [1]}])
    store.append_step("w1", [{"task_id": running, "delta": "b", "tokens": [2]}])
    many = [make_task()["task"]["id"] for _ in range(600)]  # more than one chunk of ids
    got = store.last_sequences([queued, running, "task_gone", queued] + many)
    assert got[queued] == store.last_sequence(queued)
    assert got[running] == store.last_sequence(running) > got[queued]
    assert "task_gone" not in got  # no such task: left out
    assert len(got) == 602 and all(got[t] == got[queued] for t in many)
    assert store.last_sequences([]) == {}


def test_claim_takes_oldest_first_and_only_once(store, make_task, clock):
    tids = []
    for _ in range(4):
        tids.append(make_task()["task"]["id"])
        clock.advance(1)
    first = store.claim("w1", limit=3, lease=30)
    assert [c["task_id"] for c in first] == tids[:3]
    assert first[0]["request"]["input"] == "hello" and first[0]["resume"] is None
    assert first[0]["status"] == "queued" and first[0]["attempts"] == 1
    assert [c["task_id"] for c in store.claim("w2", limit=3, lease=30)] == tids[3:]
    assert store.claim("w3", limit=3, lease=30) == []


def test_create_task_can_claim_the_new_task_for_a_worker(store, make_task, clock):
    created = make_task(claim=("w1", 30))
    tid = created["task"]["id"]
    assert created["response"]["status"] == "queued"  # the response as created
    assert created["task"]["status"] == "running"
    assert created["claim"]["task_id"] == tid and created["claim"]["status"] == "queued"
    assert created["claim"]["request"]["input"] == "hello" and created["claim"]["resume"] is None
    events = all_events(store, tid)
    assert [(e["type"], e["sequence_number"]) for e in events] == [
        ("response.created", 1), ("response.queued", 2), ("task.running", 3), ("response.in_progress", 4)]
    assert events[3]["response"]["status"] == "in_progress"
    assert store.get_task(tid) == created["task"]
    assert store.claim("w2", limit=5, lease=30) == []  # taken: nobody else gets it
    store.append_step("w1", [{"task_id": tid, "delta": "hi", "tokens": [5], "finish": "stop",
                              "usage": {"input_tokens": 2, "output_tokens": 1}}])
    assert store.get_task(tid)["status"] == "completed"


def test_create_task_leaves_the_new_task_queued_behind_older_ones(store, make_task, clock):
    older = make_task()["task"]["id"]
    clock.advance(1)
    created = make_task(claim=("w1", 30))
    assert created["claim"] is None and created["task"]["status"] == "queued"
    assert [c["task_id"] for c in store.claim("w1", limit=5, lease=30)] == [older, created["task"]["id"]]


def test_state_changes_need_the_claim(store, make_task):
    tid = make_task()["task"]["id"]
    with pytest.raises(ClaimLost):
        store.set_loading(tid, "w1")
    store.claim("w1", limit=1, lease=30)
    with pytest.raises(ClaimLost):
        store.set_running(tid, "w2")
    with pytest.raises(ClaimLost):
        store.fail_task(tid, "w2", code="x", message="y")
    store.set_loading(tid, "w1")
    store.set_running(tid, "w1")
    assert event_types(store, tid)[2:] == ["task.loading", "task.running", "response.in_progress"]
    store.set_running(tid, "w1")  # already running (a resumed task): nothing written
    assert store.last_sequence(tid) == 5
    with pytest.raises(IllegalTransition):
        store.set_loading(tid, "w1")
    assert store.last_sequence(tid) == 5


def test_illegal_transition_changes_nothing(store, running_task):
    tid = running_task()
    store.append_step("w1", [{"task_id": tid, "delta": "a", "tokens": [1], "finish": "stop"}])
    before = (store.get_task(tid), event_types(store, tid))
    for call in (lambda: store.set_running(tid, "w1"), lambda: store.set_loading(tid, "w1"),
                 lambda: store.fail_task(tid, "w1", code="x", message="y")):
        with pytest.raises(IllegalTransition):
            call()
    assert (store.get_task(tid), event_types(store, tid)) == before


def test_fail_task(store, make_task):
    tid = make_task()["task"]["id"]
    store.claim("w1", limit=1, lease=30)
    store.set_loading(tid, "w1")
    store.fail_task(tid, "w1", code="model_load_failed", message="bad file")
    task = store.get_task(tid)
    assert task["status"] == "failed" and task["error"] == {"code": "model_load_failed", "message": "bad file"}
    assert event_types(store, tid)[-1] == "response.failed"
    failed = all_events(store, tid)[-1]
    assert failed["response"]["error"]["code"] == "model_load_failed" and "error" not in failed


def test_a_failed_event_stored_with_a_top_level_error_is_read_without_it(store, make_task, db_path):
    """Rows written before B.6 said where the error goes keep it at the top; it is not shown."""
    tid = make_task()["task"]["id"]
    store.claim("w1", limit=1, lease=30)
    store.fail_task(tid, "w1", code="model_load_failed", message="bad file")
    conn = sqlite3.connect(db_path)
    try:
        with conn:
            conn.execute("UPDATE task_events SET data = json_set(data, '$.error', json(?)) "
                         "WHERE task_id = ? AND type = 'response.failed'",
                         ('{"code": "model_load_failed", "message": "bad file"}', tid))
    finally:
        conn.close()
    failed = all_events(store, tid)[-1]
    assert failed["type"] == "response.failed" and "error" not in failed
    assert failed["response"]["error"]["code"] == "model_load_failed"


# -- cancel (B.7) -----------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["queued", "claimed", "loading"])
def test_cancel_before_running_is_immediate(store, make_task, state):
    created = make_task()
    tid = created["task"]["id"]
    if state in ("claimed", "loading"):
        store.claim("w1", limit=1, lease=30)
    if state == "loading":
        store.set_loading(tid, "w1")
    task = store.cancel(created["response"]["id"])  # by response id
    assert task["status"] == "cancelled" and task["finished_at"] is not None
    assert event_types(store, tid)[-1] == "response.cancelled"
    assert store.get_response(created["response"]["id"])["status"] == "cancelled"
    if state != "queued":
        with pytest.raises(IllegalTransition):
            store.set_running(tid, "w1")
    assert store.claim("w2", limit=5, lease=30) == []


def test_cancel_running_goes_through_cancelling_and_wins(store, running_task):
    tid = running_task()
    store.append_step("w1", [{"task_id": tid, "delta": "a", "tokens": [1]}])
    task = store.cancel(tid)
    assert task["status"] == "cancelling"
    assert event_types(store, tid)[-1] == "task.cancelling"
    assert store.renew("w1", lease=30) == [tid]
    assert store.cancel(tid)["status"] == "cancelling"  # idempotent
    n = store.last_sequence(tid)
    assert store.last_sequence(tid) == n
    result = store.append_step("w1", [{"task_id": tid, "delta": "b", "tokens": [2], "finish": "stop"}])
    assert result["cancelled"] == [tid]
    assert store.get_task(tid)["status"] == "cancelled"
    assert event_types(store, tid)[-1] == "response.cancelled"
    assert "response.completed" not in event_types(store, tid)
    assert store.cancel(tid)["status"] == "cancelled"  # idempotent
    assert_consistent(store, tid)


def test_cancelling_task_that_fails_ends_cancelled(store, running_task):
    tid = running_task()
    store.cancel(tid)
    store.fail_task(tid, "w1", code="engine_error", message="x")
    assert store.get_task(tid)["status"] == "cancelled"
    assert_consistent(store, tid)


@pytest.mark.parametrize("finish", ["stop", "error"])
def test_cancel_of_finished_task_is_refused(store, running_task, finish):
    tid = running_task()
    store.append_step("w1", [{"task_id": tid, "delta": "a", "tokens": [1], "finish": finish}])
    before = store.last_sequence(tid)
    with pytest.raises(TaskFinished):
        store.cancel(tid)
    assert store.last_sequence(tid) == before


def test_cancel_unknown_is_not_found(store):
    with pytest.raises(NotFound):
        store.cancel("task_nope")
    with pytest.raises(NotFound):
        store.cancel("resp_nope")


# -- reading ----------------------------------------------------------------------------------
def test_events_pagination(store, running_task):
    tid = running_task()
    for i in range(10):
        store.append_step("w1", [{"task_id": tid, "delta": str(i), "tokens": [i]}])
    total = store.last_sequence(tid)
    seen, after = [], 0
    while True:
        page = store.events(tid, after=after, limit=3)
        seen += [e["sequence_number"] for e in page["data"]]
        if not page["has_more"]:
            break
        after = page["data"][-1]["sequence_number"]
    assert seen == list(range(1, total + 1))
    assert store.events(tid, after=total)["data"] == []
    with pytest.raises(InvalidRequest):
        store.events(tid, after=-1)
    with pytest.raises(InvalidRequest):
        store.events(tid, limit=0)


def test_list_responses_and_tasks(store, make_task, running_task, clock):
    ids = []
    for _ in range(5):
        ids.append(make_task()["response"]["id"])
        clock.advance(1)
    make_task(client_id="cli_b")
    page = store.list_responses("cli_a", limit=2)
    assert [r["id"] for r in page["data"]] == ids[::-1][:2] and page["has_more"]
    assert page["first_id"] == ids[4] and page["last_id"] == ids[3]
    page2 = store.list_responses("cli_a", limit=10, after=page["last_id"])
    assert [r["id"] for r in page2["data"]] == ids[::-1][2:] and not page2["has_more"]
    assert len(store.list_responses(None, limit=100)["data"]) == 6
    store.cancel(ids[0])
    assert [r["id"] for r in store.list_responses("cli_a", status="cancelled")["data"]] == [ids[0]]
    assert len(store.list_responses("cli_a", status="queued")["data"]) == 4
    tasks = store.list_tasks("cli_a", status="queued", limit=100)
    assert len(tasks["data"]) == 4 and all(t["object"] == "task" for t in tasks["data"])
    for bad in (dict(status="bogus"), dict(limit=0), dict(limit=1000)):
        with pytest.raises(InvalidRequest):
            store.list_responses("cli_a", **bad)
        with pytest.raises(InvalidRequest):
            store.list_tasks("cli_a", **bad)


def test_delete_response(store, make_task, running_task):
    unfinished = make_task()
    with pytest.raises(TaskUnfinished):
        store.delete_response(unfinished["response"]["id"])
    assert store.get_task(unfinished["task"]["id"])["status"] == "queued"
    store.cancel(unfinished["response"]["id"])
    assert store.delete_response(unfinished["response"]["id"]) == {
        "id": unfinished["response"]["id"], "object": "response", "deleted": True}
    with pytest.raises(NotFound):
        store.get_response(unfinished["response"]["id"])
    with pytest.raises(NotFound):
        store.events(unfinished["task"]["id"])


def test_forget_responses_deletes_several_in_one_write(store, make_task, running_task, db_path):
    done = []
    for _ in range(3):
        tid = running_task()
        store.append_step("w1", [{"task_id": tid, "delta": "x", "tokens": [1]}, {"task_id": tid, "finish": "stop"}])
        done.append(store.get_task(tid)["response_id"])
    unfinished = make_task()["response"]["id"]
    given = [(done[0], "cli_a"), (unfinished, "cli_a"), (done[1], "cli_b"), ("resp_gone", None), (done[2], None)]
    # one transaction: a delete that fails at the last response takes the first one's back
    with sqlite3.connect(db_path) as conn:
        conn.execute(f"CREATE TRIGGER keep_last BEFORE DELETE ON responses WHEN OLD.id = '{done[2]}'"
                     " BEGIN SELECT RAISE(ABORT, 'kept'); END")
    with pytest.raises(StoreError, match="kept"):
        store.forget_responses(given)
    assert [store.get_response(rid)["id"] for rid in done] == done
    with sqlite3.connect(db_path) as conn:
        conn.execute("DROP TRIGGER keep_last")
    errors = store.forget_responses(given)
    assert [type(e).__name__ if e else None for e in errors] == [
        None, "TaskUnfinished", "NotFound", "NotFound", None]
    for rid in (done[0], done[2]):
        with pytest.raises(NotFound):
            store.get_response(rid)
    for rid in (unfinished, done[1]):  # left in place: unfinished, another client's
        assert store.get_response(rid)["id"] == rid


def test_one_transaction_may_carry_several_steps_of_a_task(store, running_task):
    a, b = running_task(), running_task()
    store.append_step("w1", [{"task_id": a, "delta": "x", "tokens": [1]}])  # a is known, b is not
    items = [{"task_id": t, "delta": f"{t[-2:]}{i}", "tokens": [i]} for i in range(3) for t in (a, b)]
    store.append_step("w1", items)
    store.append_step("w1", items + [{"task_id": a, "finish": "stop"}, {"task_id": a, "delta": "late"}])
    assert store.output_text(a) == "x" + "".join(f"{a[-2:]}{i}" for i in range(3)) * 2
    assert store.get_task(a)["status"] == "completed" and store.get_task(b)["status"] == "running"
    for tid in (a, b):
        assert_consistent(store, tid)


def test_a_step_after_someone_else_wrote_the_task_rereads_it(store, running_task, db_path):
    from lmsp.store import Store
    tid = running_task()
    store.append_step("w1", [{"task_id": tid, "delta": "a", "tokens": [1]}])
    other = Store.open(db_path)  # another process, in effect
    other.cancel(tid)
    store.append_step("w1", [{"task_id": tid, "delta": "b", "tokens": [2]}])
    other.recover(startup=True)  # the task is taken away from w1 (cancelling -> cancelled)
    result = store.append_step("w1", [{"task_id": tid, "delta": "c", "tokens": [3]}])
    assert result["skipped"] == [tid]
    other.close()
    assert store.output_text(tid) == "ab"
    assert event_types(store, tid)[-6:] == ["task.cancelling", "response.output_text.delta",
                                            "response.output_text.done", "response.content_part.done",
                                            "response.output_item.done", "response.cancelled"]
    assert_consistent(store, tid)


def test_renew_extends_only_the_named_tasks(store, running_task, db_path, clock):
    kept, lost = running_task(), running_task()
    clock.advance(20)
    assert store.renew("w1", lease=30, task_ids=[kept]) == []
    conn = sqlite3.connect(db_path)
    try:
        leases = dict(conn.execute("SELECT id, lease_expires FROM tasks WHERE id IN (?, ?)", (kept, lost)))
    finally:
        conn.close()
    assert leases[kept] == clock.now + 30
    assert leases[lost] < clock.now + 30  # as claimed: it runs out first
    clock.advance(11)
    assert store.recover(startup=False)["failed"] == [lost]
    assert store.get_task(kept)["status"] == "running"


def test_the_kind_names_the_id_and_lists_keep_kinds_apart(store, make_task):
    ids = {kind: make_task(kind=kind)["response"]["id"] for kind in ("response", "chat.completion", "text_completion")}
    assert ids["response"].startswith("resp_") and ids["chat.completion"].startswith("chatcmpl-")
    assert ids["text_completion"].startswith("cmpl-")
    assert [r["id"] for r in store.list_responses("cli_a")["data"]] == [ids["response"]]
    chats = store.list_responses("cli_a", prefix="chatcmpl-")["data"]
    assert [r["id"] for r in chats] == [ids["chat.completion"]]
    store.cancel(ids["chat.completion"], "cli_a")  # a chat completion's id names its task, as a response's
    assert store.get_response(ids["chat.completion"])["status"] == "cancelled"
    with pytest.raises(InvalidRequest):
        make_task(kind="nonsense")


def test_an_embeddings_task_is_claimed_at_once_even_behind_waiting_tasks(store, make_task):
    make_task()  # queued, unclaimed: a generating task would wait behind it
    created = make_task(kind="embedding", claim=("w1", 30.0))
    assert created["response"]["id"].startswith("embd-") and created["claim"] is not None
    assert store.get_task(created["task"]["id"])["status"] == "running"
    with pytest.raises(ValueError):
        make_task(kind="embedding")  # never queued: no scheduler would run it
