"""Helpers of the runtime tests: submit a task, wait for it, read its log."""
from __future__ import annotations

import time

FINISHED = ("completed", "failed", "cancelled")


def queued(runtime) -> None:
    """Wake the runtime's scheduler for a task put in the store, as its admission does
    for a task it queued without claiming it: a round claims it now, not at the next
    idle round (which finds the tasks that other workers queued)."""
    runtime.state.wake_scheduler()


def submit(store, runtime, text="Once upon a time", *, model="tiny", on_restart="fail", **request):
    request = {"model": model, "input": text, "temperature": 0.0, **request}
    created = store.create_task(client_id=None, model=model, request=request, on_restart=on_restart,
                                background=True, stream=False)
    if runtime is not None:
        queued(runtime)
    return created["task"]["id"]


def wait_until(runtime_or_store, store, task_id, predicate, timeout=60.0):
    """Wait (woken by commits) until ``predicate(task)``; the task. A hang fails with the task's state."""
    deadline = time.monotonic() + timeout
    while True:
        task = store.get_task(task_id)
        if predicate(task):
            return task
        if time.monotonic() > deadline:
            raise AssertionError(f"task {task_id} stuck: {task}")
        if runtime_or_store is not None:
            runtime_or_store.wait_for_commit(task_id, task["last_sequence_number"], 0.25)
        else:
            time.sleep(0.05)


def wait_finished(runtime, store, task_id, timeout=60.0):
    return wait_until(runtime, store, task_id, lambda t: t["status"] in FINISHED, timeout)


def claimed_once_settled(runtime, timeout=10.0):
    """The worker's claimed tasks once its runs have settled. A task's end is in the
    store before the committer drops its run (a refused commit keeps the run), so a
    poll of the store can see the end a moment before the run leaves the table."""
    deadline = time.monotonic() + timeout
    while (claimed := runtime.metrics()["claimed_tasks"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    return claimed


def all_events(store, task_id):
    out, after = [], 0
    while True:
        page = store.events(task_id, after=after)
        out.extend(page["data"])
        if not page["has_more"]:
            return out
        after = out[-1]["sequence_number"]


def deltas(events):
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def check_log(events):
    """Sequence numbers 1..N without gaps or repeats; returns the event types."""
    seqs = [e["sequence_number"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    return [e["type"] for e in events]
