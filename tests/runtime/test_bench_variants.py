"""The serving benchmark's commit variants (bench/variants.py) on the real store and engine."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from runtime_helpers import all_events, check_log, deltas, submit, wait_finished

VARIANTS = Path(__file__).resolve().parents[2] / "bench" / "variants.py"


@pytest.fixture(scope="module")
def variants():
    spec = importlib.util.spec_from_file_location("bench_variants", VARIANTS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _spy_writes(store) -> list[set[str]]:
    """The tasks of each append_step transaction, from now on."""
    writes: list[set[str]] = []
    real = store.append_step

    def spy(owner, items, **kwargs):
        writes.append({item["task_id"] for item in items})
        return real(owner, items, **kwargs)

    store.append_step = spy
    return writes


def _written_at_the_end(store, runtime, text: str) -> list[dict]:
    """Run one task, check that its events were written in one transaction at its end; its events."""
    writes = _spy_writes(store)
    task_id = submit(store, runtime, text, max_output_tokens=30)
    task = wait_finished(runtime, store, task_id)
    assert task["status"] == "completed"
    assert writes == [{task_id}]  # one transaction, at the end
    events = all_events(store, task_id)
    check_log(events)
    assert deltas(events) == store.output_text(task_id)
    return events


def test_the_in_memory_variant_streams_every_event_and_writes_them_at_the_end(store, make_runtime, model_file,
                                                                              variants):
    runtime = make_runtime(store, start=False)
    variants.with_committer(runtime, variants.EventsInMemory).start()
    runtime.register_model("tiny.gguf")
    wait_finished(runtime, store, submit(store, runtime, max_output_tokens=2))  # loads the model
    shown = []
    notify = runtime.waiters.notify

    def watch(task_ids):
        for task_id in task_ids:
            entry = runtime.state.committed.get(task_id)
            if entry is not None:
                shown.extend(row[0] for row in entry[1])
        notify(task_ids)

    runtime.waiters.notify = watch
    # a run whose output came in several deltas (on a busy machine one commit round can
    # gather the whole output, which shows nothing of the variant)
    for _ in range(8):
        shown.clear()
        events = _written_at_the_end(store, runtime, "Held in memory")
        deltas_at = [e["sequence_number"] for e in events if e["type"] == "response.output_text.delta"]
        if len(deltas_at) >= 2:
            break
    # every delta but one coming with the end was handed to the streams before it was written
    assert len(deltas_at) >= 2 and set(deltas_at[:-1]) <= set(shown)
    assert sorted(set(shown)) == list(range(min(shown), max(shown) + 1)) and max(shown) <= deltas_at[-1]


def test_the_deferred_variant_writes_a_tasks_text_once_at_its_end(store, make_runtime, model_file, variants):
    runtime = make_runtime(store, start=False)
    variants.with_committer(runtime, variants.DeferredDeltas).start()
    runtime.register_model("tiny.gguf")
    wait_finished(runtime, store, submit(store, runtime, max_output_tokens=2))  # loads the model
    events = _written_at_the_end(store, runtime, "Written at the end")
    assert [e["type"] for e in events].count("response.output_text.delta") == 1  # the whole text at once
    assert deltas(events)
