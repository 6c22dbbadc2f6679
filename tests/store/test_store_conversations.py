"""A conversation's turns in the store: appended in the transaction of the response's
terminal event, once, whatever the restart policy; one response in progress at a time."""

from __future__ import annotations

import sqlite3

import pytest

from lmsp.errors import ConversationBusy, NotFound
from lmsp.store import Store, StoreError


def user_item(text: str, n: int) -> dict:
    return {
        "id": f"msg_in{n}",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [{"type": "input_text", "text": text}],
    }


@pytest.fixture
def turn(store: Store, make_task):
    """``turn(cid, text)``: a new response of the conversation, claimed by ``w1`` and running."""
    made = [0]

    def make(cid: str, text: str, policy: str = "fail") -> str:
        made[0] += 1
        version = store.conversation_items(cid, "cli_a")[1]
        tid = make_task(policy, items=[user_item(text, made[0])], conversation=(cid, version))["task"]["id"]
        assert tid in [c["task_id"] for c in store.claim("w1", limit=100, lease=30)]
        store.set_running(tid, "w1")
        return tid

    return make


def texts(store: Store, cid: str) -> list[str]:
    return [part["text"] for item in store.conversation_items(cid, "cli_a")[0] for part in item["content"]]


def test_a_turn_is_appended_with_its_terminal_event_only(store, turn):
    cid = store.create_conversation("cli_a", {}, [])["id"]
    tid = turn(cid, "hi")
    store.append_step("w1", [{"task_id": tid, "delta": "Hel", "tokens": [1]}])
    assert texts(store, cid) == []
    store.append_step("w1", [{"task_id": tid, "delta": "lo", "tokens": [2], "finish": "stop"}])
    assert texts(store, cid) == ["hi", "Hello"]
    listed = store.conversation_items(cid, "cli_a")[0]
    response = store.get_response(store.get_task(tid)["response_id"])
    assert listed[0]["id"] == "msg_in1" and listed[1] == response["output"][0]


def test_the_append_is_part_of_the_terminal_transaction(store, turn, db_path):
    cid = store.create_conversation("cli_a", {}, [])["id"]
    tid = turn(cid, "hi")
    store.append_step("w1", [{"task_id": tid, "delta": "Hel", "tokens": [1]}])
    with sqlite3.connect(db_path) as conn:  # an append that fails takes the task's end with it
        conn.execute("CREATE TRIGGER no_items BEFORE INSERT ON conversation_items BEGIN SELECT RAISE(ABORT, 'x'); END")
    with pytest.raises(StoreError, match="x"):
        store.append_step("w1", [{"task_id": tid, "delta": "lo", "tokens": [2], "finish": "stop"}])
    assert store.get_task(tid)["status"] == "running" and texts(store, cid) == []
    assert "response.completed" not in [e["type"] for e in store.events(tid)["data"]]
    with sqlite3.connect(db_path) as conn:
        conn.execute("DROP TRIGGER no_items")
    store.append_step("w1", [{"task_id": tid, "delta": "lo", "tokens": [2], "finish": "stop"}])
    assert store.get_task(tid)["status"] == "completed" and texts(store, cid) == ["hi", "Hello"]


@pytest.mark.parametrize(
    "policy,expected",
    [
        ("fail", ["hi", "Hel"]),  # failed at the restart: its input and what it committed
        ("retry", ["hi", "Again"]),  # its last attempt only
        ("resume", ["hi", "Hello"]),  # once, its whole output
    ],
)
def test_a_restart_appends_a_turn_once(store, turn, policy, expected):
    cid = store.create_conversation("cli_a", {}, [])["id"]
    tid = turn(cid, "hi", policy)
    store.append_step("w1", [{"task_id": tid, "delta": "Hel", "tokens": [1]}])
    store.recover(startup=True)  # the worker died
    if policy != "fail":
        assert texts(store, cid) == []
        assert tid in [c["task_id"] for c in store.claim("w2", limit=10, lease=30)]
        store.set_running(tid, "w2")
        delta = "Again" if policy == "retry" else "lo"
        store.append_step("w2", [{"task_id": tid, "delta": delta, "tokens": [3], "finish": "stop"}])
    assert texts(store, cid) == expected
    store.recover(startup=True)  # nothing left to recover appends nothing
    assert texts(store, cid) == expected
    assert turn(cid, "next")  # the conversation is free again


def test_one_response_in_progress_per_conversation(store, turn, make_task):
    cid = store.create_conversation("cli_a", {}, [])["id"]
    tid = turn(cid, "hi")
    with pytest.raises(ConversationBusy):
        make_task(items=[user_item("two", 9)], conversation=(cid, store.conversation_items(cid, "cli_a")[1]))
    assert len(store.list_tasks()["data"]) == 1  # nothing of the refused one was written
    store.cancel(tid)
    store.append_step("w1", [{"task_id": tid, "finish": "cancelled"}])
    assert texts(store, cid) == ["hi"]
    assert turn(cid, "two")


def test_a_conversation_changed_since_its_context_was_read_is_refused(store, make_task):
    cid = store.create_conversation("cli_a", {}, [user_item("a", 1)])["id"]
    _, version = store.conversation_items(cid, "cli_a")
    store.add_conversation_items(cid, [user_item("b", 2)], "cli_a")
    with pytest.raises(ConversationBusy):
        make_task(conversation=(cid, version))
    with pytest.raises(NotFound):
        make_task(conversation=(cid, version + 1), client_id="cli_b")  # another client's


def test_deleting_a_response_keeps_the_conversations_items(store, turn):
    cid = store.create_conversation("cli_a", {}, [])["id"]
    tid = turn(cid, "hi")
    store.append_step("w1", [{"task_id": tid, "delta": "Hello", "tokens": [1], "finish": "stop"}])
    store.delete_response(store.get_task(tid)["response_id"])
    assert texts(store, cid) == ["hi", "Hello"]
    store.delete_conversation(cid, "cli_a")
    with pytest.raises(NotFound):
        store.conversation_items(cid, "cli_a")
