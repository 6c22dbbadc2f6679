"""Assertions shared by the store tests (imported by name: this folder is on sys.path)."""
from __future__ import annotations

from lmsp.store import Store

TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed", "response.cancelled")


def all_events(store: Store, task_id: str) -> list[dict]:
    return store.events(task_id, limit=1_000_000)["data"]


def event_types(store: Store, task_id: str) -> list[str]:
    return [e["type"] for e in all_events(store, task_id)]


def assert_gapless(store: Store, task_id: str) -> None:
    events = all_events(store, task_id)
    assert [e["sequence_number"] for e in events] == list(range(1, len(events) + 1))
    assert store.last_sequence(task_id) == len(events)
    assert store.get_task(task_id)["last_sequence_number"] == len(events)


def assert_consistent(store: Store, task_id: str) -> None:
    """Gapless log; at most one terminal event, last, matching the state; a cancel wins."""
    assert_gapless(store, task_id)
    types = event_types(store, task_id)
    task = store.get_task(task_id)
    terminal = [t for t in types if t in TERMINAL_EVENTS]
    assert len(terminal) <= 1, types
    if task["status"] in ("completed", "failed", "cancelled"):
        assert terminal and types[-1] == terminal[0], types
        expected = {"failed": ["response.failed"], "cancelled": ["response.cancelled"],
                    "completed": ["response.completed", "response.incomplete"]}[task["status"]]
        assert terminal[0] in expected
    else:
        assert not terminal, types
    if "task.cancelling" in types:
        assert task["status"] in ("cancelling", "cancelled"), (task, types)
