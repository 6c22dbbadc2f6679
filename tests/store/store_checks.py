"""Assertions shared by the store tests (imported by name: this folder is on sys.path)."""
from __future__ import annotations

from lmsp.store import Store

TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed", "response.cancelled")

# LMSP 11.3, written out as the contract states it: (state found at start, on_restart) ->
# the state the task moves to. The tests take their expectations from here, never from
# the store's own table, so that a change to the store's table fails them.
SPEC_RECOVERY = {
    ("queued", "fail"): "failed", ("queued", "retry"): "queued", ("queued", "resume"): "queued",
    ("loading", "fail"): "failed", ("loading", "retry"): "queued", ("loading", "resume"): "queued",
    ("running", "fail"): "failed", ("running", "retry"): "queued", ("running", "resume"): "running",
    ("cancelling", "fail"): "cancelled", ("cancelling", "retry"): "cancelled", ("cancelling", "resume"): "cancelled",
}

# The moves LMSP allows, each with where it comes from:
SPEC_TRANSITIONS = {
    # B.6 states; a worker loads the model (task.loading) or finds it loaded (task.running);
    # B.7 cancels a queued task at once; a model that cannot be loaded fails it;
    # 11.3 requeues it (queued -> queued) or fails it
    "queued": {"queued", "loading", "running", "cancelled", "failed"},
    # a load that ends: running, failed (model_load_failed), B.7 cancelled, 11.3 queued
    "loading": {"queued", "running", "cancelled", "failed"},
    # the engine ends it (completed/incomplete, failed), B.7 cancelling, 11.3 queued or
    # running again (resume); a resumable task no worker holds is cancelled at once
    "running": {"queued", "running", "cancelling", "completed", "failed", "cancelled"},
    # B.7: once a cancel is accepted the task ends cancelled, never completed
    "cancelling": {"cancelled"},
    "completed": set(), "failed": set(), "cancelled": set(),
}


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
        # an output item opened in the last attempt is closed before the end, however it ends
        last = types[len(types) - types[::-1].index("task.requeued"):] if "task.requeued" in types else types
        assert last.count("response.output_item.added") == last.count("response.output_item.done"), types
    else:
        assert not terminal, types
    if "task.cancelling" in types:
        assert task["status"] in ("cancelling", "cancelled"), (task, types)
