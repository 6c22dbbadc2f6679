"""The runtime on the real store and engine: runs, batching, cancels, store errors."""
from __future__ import annotations

import sqlite3
import time

from runtime_helpers import (all_events, check_log, claimed_once_settled, deltas, queued, submit, wait_finished,
                             wait_until)

from lmsp.errors import Unavailable

OPENING = ["response.created", "response.queued", "task.loading", "task.running", "response.in_progress",
           "response.output_item.added", "response.content_part.added"]
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def test_a_task_runs_to_completion_with_a_gapless_log(store, runtime):
    task_id = submit(store, runtime, max_output_tokens=12)
    task = wait_finished(runtime, store, task_id)
    assert task["status"] == "completed"
    assert task["error"] is None
    events = all_events(store, task_id)
    types = check_log(events)
    assert types[:len(OPENING)] == OPENING
    body = types[len(OPENING):-4]
    assert body and set(body) == {"response.output_text.delta"}
    assert types[-4:-1] == CLOSING
    assert types[-1] == "response.incomplete"  # the demo model's greedy text runs to the cap
    text = deltas(events)
    assert text
    assert events[-4]["text"] == text
    response = store.get_response(task["response_id"])
    assert response["output"][0]["content"][0]["text"] == text
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"]["output_tokens"] == 12
    assert response["usage"]["input_tokens"] > 0
    # the commit thread counts a commit's tokens and the finish just after the
    # store made them visible
    deadline = time.monotonic() + 10
    while (figures := runtime.metrics())["decode_tokens_per_second"]["count"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert figures["tokens_generated"] >= response["usage"]["output_tokens"]
    assert figures["ttft_seconds"]["count"] == 1
    assert figures["decode_tokens_per_second"]["count"] == 1  # the engine's rate of the task
    assert figures["decode_tokens_per_second"]["sum"] > 0


def test_a_task_of_one_token_has_no_decode_rate():
    from lmsp.runtime.metrics import Metrics
    figures = Metrics()
    figures.finish("length", 3, 0, {"decode_ms": 0.0075, "tokens_per_s": 0.0})  # what the engine reports
    figures.finish("stop", 3, 0, {"decode_ms": 10.0, "tokens_per_s": 700.0})
    rate = figures.snapshot()["decode_tokens_per_second"]
    assert rate["count"] == 1 and rate["sum"] == 700.0


def test_a_request_meeting_a_free_slot_is_claimed_as_it_is_created(store, runtime):
    wait_finished(runtime, store, submit(store, runtime, max_output_tokens=2))  # loads the model
    slot = runtime.admission.reserve("tiny")
    assert slot == (runtime.owner, runtime.lease)
    created = store.create_task(client_id=None, model="tiny", on_restart="fail", background=True, stream=False,
                                request={"model": "tiny", "input": "Hi", "max_output_tokens": 4}, claim=slot)
    runtime.admission.adopt(created["claim"])
    task = wait_finished(runtime, store, created["task"]["id"])
    assert task["status"] == "completed"
    types = check_log(all_events(store, task["id"]))
    assert types[:len(OPENING) - 1] == [t for t in OPENING if t != "task.loading"]  # the model was loaded
    # every slot reserved is a slot the scheduler does not fill meanwhile
    slots = [runtime.admission.reserve("tiny") for _ in range(runtime.config.n_parallel + 1)]
    assert slots[-1] is None and all(s is not None for s in slots[:-1])
    for _ in slots[:-1]:
        runtime.admission.adopt(None)
    assert runtime.admission.reserve("unknown-model") is None


def _render(runtime, request):
    from lmsp.runtime import prompt as prompting

    return runtime.admission.prompt_of(request["model"], prompting.messages_for(request))[0]


def test_a_sequence_started_early_becomes_its_tasks_once_the_task_commits(store, runtime):
    request = {"model": "tiny", "input": "Early bird", "max_output_tokens": 6, "temperature": 1.0, "seed": 5}
    usual = submit(store, runtime, "Early bird", max_output_tokens=6, temperature=1.0, seed=5)
    wait_finished(runtime, store, usual)
    tokens = _render(runtime, request)
    assert tokens
    slot = runtime.admission.reserve("tiny")
    early = runtime.admission.start_early("tiny", tokens, request)
    assert early is not None
    # the sequence runs to its end before its task exists: the results wait
    wait_for = time.monotonic() + 60
    while not any(r.get("finish") for r in list(early.held)) and time.monotonic() < wait_for:
        time.sleep(0.01)
    assert early.held and early.held[-1]["finish"] == "length"
    assert not runtime.committer.pending
    created = store.create_task(client_id=None, model="tiny", on_restart="fail", background=True, stream=False,
                                request=request, claim=slot)
    runtime.admission.adopt(created["claim"], tokens, early=early)
    task = wait_finished(runtime, store, created["task"]["id"])
    assert task["status"] == "completed"
    events = all_events(store, task["id"])
    check_log(events)
    assert deltas(events) == store.output_text(usual)  # the same output as a task started as usual
    assert claimed_once_settled(runtime) == 0


def test_a_sequence_started_early_for_a_task_not_created_is_dropped(store, runtime):
    wait_finished(runtime, store, submit(store, runtime, max_output_tokens=2))  # loads the model
    request = {"model": "tiny", "input": "Never stored", "max_output_tokens": 400, "temperature": 0.0}
    engine = runtime.registry.engine("tiny")
    before = engine.stats()["finished"]
    n = runtime.config.n_parallel + 1  # more than the slots: one kept by mistake would show
    for _ in range(n):
        assert runtime.admission.reserve("tiny")
        early = runtime.admission.start_early("tiny", _render(runtime, request), request)
        assert early is not None
        runtime.admission.adopt(None, early=early)  # the creation failed, or replayed an earlier task
    wait_for = time.monotonic() + 60
    while engine.stats()["finished"] < before + n and time.monotonic() < wait_for:
        time.sleep(0.01)
    assert engine.stats()["finished"] == before + n  # cancelled at their next step
    assert engine.stats()["active"] == 0
    slots = [runtime.admission.reserve("tiny") for _ in range(runtime.config.n_parallel)]
    assert all(slots)
    for _ in slots:
        runtime.admission.adopt(None)
    assert runtime.metrics()["claimed_tasks"] == 0 and not runtime.state.by_seq


def test_the_requests_sampling_fields_reach_the_engine(store, runtime):
    """stop, top_k and top_p, seen by what they do to the text of the demo model."""
    def run(**fields):
        tid = submit(store, runtime, "The quick brown fox", max_output_tokens=24, **fields)
        task = wait_finished(runtime, store, tid)
        return store.output_text(tid), store.get_response(task["response_id"])

    greedy, _ = run()
    assert len(greedy) > 12
    stop = greedy[len(greedy) // 2:len(greedy) // 2 + 3]
    text, response = run(stop=[stop])  # the text ends before the stop string's first place
    assert text == greedy[:greedy.index(stop)] and response["status"] == "completed"
    hot, _ = run(temperature=1.5, seed=7)
    assert hot != greedy  # a hot seeded sample leaves the greedy path...
    assert run(temperature=1.5, seed=7, top_k=1)[0] == greedy  # ...unless only the best token is kept
    assert run(temperature=1.5, seed=7, top_p=1e-6)[0] == greedy


def test_greedy_output_is_reproducible(store, runtime):
    first = submit(store, runtime, "The quick brown fox", max_output_tokens=10)
    second = submit(store, runtime, "The quick brown fox", max_output_tokens=10)
    for task_id in (first, second):
        wait_finished(runtime, store, task_id)
    assert deltas(all_events(store, first)) == deltas(all_events(store, second))


def test_group_commit_gathers_steps_but_not_the_first_output_or_the_end(store, make_runtime, model_file, config):
    """With a commit window, one transaction carries the output of many engine steps;
    the first output of a task and its end are committed as soon as they come."""
    rt = make_runtime(store, config=config.replace(commit_window_ms=1000.0))
    rt.register_model("tiny.gguf")
    commits = []
    real = store.append_step

    def spy(owner, items, **kwargs):
        commits.append([(item["task_id"], len(item["tokens"]), item["finish"]) for item in items])
        return real(owner, items, **kwargs)

    rt.store.append_step = spy  # the runtime's store is this fixture's store
    task_id = submit(store, rt, max_output_tokens=40)
    task = wait_finished(rt, store, task_id)
    assert task["status"] == "completed"
    events = all_events(store, task_id)
    check_log(events)
    tokens = [n for commit in commits for _, n, _ in commit]
    assert sum(tokens) == 40 or events[-1]["type"] == "response.completed"
    # the first commit with output carries it alone, at once; the last carries the end
    first = next(i for i, commit in enumerate(commits) if commit[0][1])
    assert commits[first][0][2] is None and commits[first][0][1] < sum(tokens)
    assert commits[-1][0][2] is not None
    # in between, a window of a second gathers the rest: far fewer commits than tokens
    assert len(commits) - first <= 3, commits
    assert rt.metrics()["tokens_generated"] == sum(tokens)


def test_the_commit_thread_sleeps_while_a_window_gathers(store, make_runtime, model_file, config):
    """Between a window's first result and its end the commit thread sleeps (an
    urgent result aside): it does not poll the engine in a loop. ``poll`` counts
    whole milliseconds, so the last fraction of one before the window's end is
    rounded up; rounded down, every window ended in a spin of empty rounds."""
    rt = make_runtime(store, config=config.replace(commit_window_ms=4.0))
    rt.register_model("tiny.gguf")
    drains = []
    real = rt.committer.drain

    def spy(engines):
        drains.append(len(rt.committer.pending))
        return real(engines)

    rt.committer.drain = spy
    task_id = submit(store, rt, "Count on:", max_output_tokens=64)
    task = wait_finished(rt, store, task_id)
    assert task["status"] == "completed"
    tokens = rt.metrics()["tokens_generated"]
    assert tokens == 64
    # a round per window end, per urgent result and per token that opens a window
    # at most; a spin makes hundreds per window
    gathering = sum(1 for pending in drains if pending)
    assert gathering <= 2 * tokens, (gathering, tokens)


def test_many_tasks_are_batched_into_shared_transactions(store, runtime):
    sizes = []
    real = store.append_step

    def spy(owner, items, **kwargs):
        sizes.append(len(items))
        return real(owner, items, **kwargs)

    store.append_step = spy
    ids = [submit(store, runtime, f"Story number {i}:", max_output_tokens=24) for i in range(8)]
    for task_id in ids:
        task = wait_finished(runtime, store, task_id)
        assert task["status"] == "completed"
        events = all_events(store, task_id)
        check_log(events)
        assert deltas(events) == store.output_text(task_id)
    # n_parallel is 4: several sequences decode together and share commits
    assert max(sizes) > 1
    assert sum(sizes) < sum(store.get_task(t)["last_sequence_number"] for t in ids)


def test_cancel_mid_run_ends_cancelled_never_completed(store, runtime):
    task_id = submit(store, runtime, "Count on:", max_output_tokens=2000)
    wait_until(runtime, store, task_id, lambda t: t["last_sequence_number"] >= 8)
    assert store.cancel(task_id)["status"] == "cancelling"
    runtime.notify_cancel(task_id)
    task = wait_finished(runtime, store, task_id)
    assert task["status"] == "cancelled"
    types = check_log(all_events(store, task_id))
    assert "task.cancelling" in types
    assert types[-1] == "response.cancelled"
    assert "response.completed" not in types and "response.incomplete" not in types


def test_a_cancel_from_another_process_is_seen_through_the_lease_renewal(store, runtime):
    task_id = submit(store, runtime, "Count on:", max_output_tokens=2000)
    wait_until(runtime, store, task_id, lambda t: t["last_sequence_number"] >= 8)
    store.cancel(task_id)  # no in-process hint: the runtime learns it from store.renew
    task = wait_finished(runtime, store, task_id)
    assert task["status"] == "cancelled"
    assert check_log(all_events(store, task_id))[-1] == "response.cancelled"


def test_a_cancel_while_queued_never_runs(store, make_runtime, model_file):
    rt = make_runtime(store, start=False)
    rt.register_model("tiny.gguf")
    task_id = submit(store, None)
    store.cancel(task_id)
    rt.start()
    other = submit(store, rt, max_output_tokens=4)
    wait_finished(rt, store, other)
    types = check_log(all_events(store, task_id))
    assert types == ["response.created", "response.queued", "response.cancelled"]


def test_store_errors_keep_results_in_memory_until_a_commit_succeeds(store, runtime):
    real = store.append_step
    failures = []

    def flaky(owner, items, **kwargs):
        if len(failures) < 3:
            failures.append(len(items))
            raise Unavailable("database is locked")
        return real(owner, items, **kwargs)

    store.append_step = flaky
    task_id = submit(store, runtime, max_output_tokens=20)
    task = wait_finished(runtime, store, task_id)
    assert len(failures) == 3
    assert task["status"] == "completed"
    events = all_events(store, task_id)
    check_log(events)
    assert deltas(events) == store.output_text(task_id)
    assert store.get_response(task["response_id"])["usage"]["output_tokens"] == 20
    assert runtime.metrics()["store_commit_errors"] == 3


def flaky(method, times):
    """``method`` failing with Unavailable (a locked database) its first ``times`` calls."""
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(args)
        if len(calls) <= times:
            raise Unavailable("database is locked")
        return method(*args, **kwargs)

    return wrapper


def test_a_busy_store_while_starting_a_task_is_retried(store, runtime):
    store.set_loading = flaky(store.set_loading, 1)
    store.set_running = flaky(store.set_running, 2)
    task_id = submit(store, runtime, max_output_tokens=6)
    task = wait_finished(runtime, store, task_id)
    assert task["status"] == "completed"
    types = check_log(all_events(store, task_id))
    assert types.count("task.loading") == 1 and types.count("task.running") == 1


def test_a_busy_store_while_failing_a_task_is_retried(store, runtime, model_file):
    model_file.write_bytes(b"changed")  # the load will refuse it
    store.fail_task = flaky(store.fail_task, 2)
    task_id = submit(store, runtime)
    task = wait_finished(runtime, store, task_id)
    assert task["status"] == "failed"
    assert task["error"]["code"] == "model_changed"


def test_waiting_for_a_local_tasks_commit_trusts_the_announcements(store, runtime, monkeypatch):
    """A stream of a task this worker runs does not ask the store whether it missed a
    commit: the generation read before its last read of the events tells."""
    from lmsp.runtime.state import Run

    waits, asked, watched = [], [], []

    class Waiter:
        def wait(self, timeout):
            waits.append(timeout)
            watched.append({task_id: sorted(group.values()) for task_id, group in runtime.watcher.watched.items()})

    monkeypatch.setattr(runtime.waiters, "register", lambda task_id: Waiter())
    monkeypatch.setattr(runtime.waiters, "unregister", lambda task_id, waiter: None)
    store_reads = type("S", (), {"last_sequence": lambda self, t: asked.append(t) or 0})()
    monkeypatch.setattr(runtime.state, "store", store_reads)
    runtime.state.runs["task_local"] = Run("task_local", "tiny")
    try:
        before = runtime.commit_generation()
        runtime.waiters.notify(["task_local"])  # a commit announced after the caller's read
        runtime.wait_for_commit("task_local", 5, 1.0, since=before)
        assert waits == [] and asked == []  # back at once, to read again
        runtime.wait_for_commit("task_local", 5, 1.0, since=runtime.commit_generation())
        assert waits == [1.0] and asked == []  # nothing new: sleeps until woken
        runtime.wait_for_commit("task_other", 5, 1.0, since=runtime.commit_generation())
        # not ours: no read of its own; the watch thread's round covers it while it waits
        assert asked == [] and waits == [1.0, 1.0]
        assert watched[-1] == {"task_other": [5]} and runtime.watcher.watched == {}
    finally:
        runtime.state.runs.pop("task_local", None)


def registered(rt, task_ids, timeout=60.0):
    """Wait until a waiter of each task is registered with the watch thread."""
    import time

    deadline = time.monotonic() + timeout
    while not all(t in rt.watcher.watched for t in task_ids):
        assert time.monotonic() < deadline, f"waiters not registered: {sorted(set(task_ids) - set(rt.watcher.watched))}"
        time.sleep(0.01)


def test_waiters_on_tasks_run_elsewhere_share_one_read_per_round(store, make_runtime):
    """Requests waiting for the events of tasks another worker runs are served by the
    watch thread: one read of all their counters per round, none per waiter, and a
    waiter wakes when its own task moves."""
    import threading

    rt = make_runtime(store)
    single, batches = [], []
    real_single, real_batch = store.last_sequence, store.last_sequences
    store.last_sequence = lambda task_id: single.append(task_id) or real_single(task_id)
    store.last_sequences = lambda ids: batches.append(sorted(ids)) or real_batch(ids)
    tids = [store.create_task(client_id=None, model="tiny", request={"input": f"q{i}"}, on_restart="fail",
                              background=True, stream=False, claim=("other-worker", 60.0))["task"]["id"]
            for i in range(20)]
    woken = {}

    def wait(task_id):
        rt.wait_for_commit(task_id, store.get_task(task_id)["last_sequence_number"], 60.0)
        woken[task_id] = True

    threads = {t: threading.Thread(target=wait, args=(t,), daemon=True) for t in tids}
    for thread in threads.values():
        thread.start()
    registered(rt, tids)
    store.append_step("other-worker", [{"task_id": tids[0], "delta": "x", "tokens": [1]}])
    threads[tids[0]].join(60.0)
    assert woken == {tids[0]: True}  # its task moved: woken long before its time-out
    store.append_step("other-worker", [{"task_id": t, "delta": "y", "tokens": [2]} for t in tids[1:]])
    for thread in threads.values():
        thread.join(60.0)
    assert set(woken) == set(tids)
    assert single == []  # no waiter asked the store for itself
    assert max(len(batch) for batch in batches) == len(tids)  # one read carried every watched task
    assert rt.watcher.watched == {}


def test_when_the_watch_thread_ends_its_waiters_are_woken_to_ask_the_store_themselves(store, make_runtime):
    import threading

    rt = make_runtime(store)
    task_id = store.create_task(client_id=None, model="tiny", request={"input": "q"}, on_restart="fail",
                                background=True, stream=False, claim=("other-worker", 60.0))["task"]["id"]
    after = store.get_task(task_id)["last_sequence_number"]
    waiter = threading.Thread(target=rt.wait_for_commit, args=(task_id, after, 600.0), daemon=True)
    waiter.start()
    registered(rt, [task_id])
    rt.stop(timeout=10.0)
    waiter.join(60.0)
    assert not waiter.is_alive()  # woken by the watch thread's end, not by its time-out
    assert rt.watches_store is False and rt.watcher.watched == {}


def test_a_claimed_task_this_worker_does_not_run_is_not_kept_alive(store, runtime, config):
    """A task held by this worker without a sequence (say its creation committed but the request
    failed before handing it over) must not have its lease renewed with the ones that run: it
    runs out, and recovery applies the task's restart policy."""
    busy = submit(store, runtime, "Count on:", max_output_tokens=2000)
    wait_until(runtime, store, busy, lambda t: t["last_sequence_number"] >= 4)
    orphan = store.create_task(client_id=None, model="tiny", request={"model": "tiny", "input": "x"},
                               on_restart="retry", background=True, stream=False,
                               claim=(runtime.owner, 60.0))["task"]["id"]

    def leases() -> dict:
        conn = sqlite3.connect(config.db_path)
        try:
            return dict(conn.execute("SELECT id, lease_expires FROM tasks WHERE id IN (?, ?)", (busy, orphan)))
        finally:
            conn.close()

    before = leases()
    runtime.committer.renew()
    after = leases()
    assert after[orphan] == before[orphan]
    assert after[busy] > before[busy]
    store.cancel(busy)
    runtime.notify_cancel(busy)
    wait_finished(runtime, store, busy)


def test_a_repeated_prompt_reports_its_cached_tokens(store, runtime):
    first = wait_finished(runtime, store, submit(store, runtime, "A story about a lighthouse",
                                                 max_output_tokens=6))
    usage = store.get_response(first["response_id"])["usage"]
    assert usage["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": usage["input_tokens"]}
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}
    again = wait_finished(runtime, store, submit(store, runtime, "A story about a lighthouse",
                                                 max_output_tokens=6))
    usage = store.get_response(again["response_id"])["usage"]
    # the whole prompt: the first output token comes from the logits its slot kept
    assert usage["input_tokens_details"] == {"cached_tokens": usage["input_tokens"], "cache_write_tokens": 0}
    assert store.output_text(again["id"]) == store.output_text(first["id"])  # greedy, invariant
    assert runtime.metrics()["cached_prompt_tokens"] == usage["input_tokens"]


def test_the_prefix_cache_can_be_turned_off(store, make_runtime, config, model_file):
    rt = make_runtime(store, config=config.replace(prefix_cache=False))
    rt.register_model("tiny.gguf")
    for _ in range(2):
        task = wait_finished(rt, store, submit(store, rt, "A story about a lighthouse", max_output_tokens=4))
        assert store.get_response(task["response_id"])["usage"]["input_tokens_details"]["cached_tokens"] == 0


def test_one_clients_prompts_are_not_cached_for_another(store, runtime):
    def ask(client_id):
        created = store.create_task(client_id=client_id, model="tiny", on_restart="fail", background=True,
                                    stream=False, request={"model": "tiny", "input": "A private question",
                                                           "temperature": 0.0, "max_output_tokens": 4})
        queued(runtime)
        task = wait_finished(runtime, store, created["task"]["id"])
        return store.get_response(task["response_id"])["usage"]["input_tokens_details"]["cached_tokens"]

    assert ask("cli_a") == 0
    assert ask("cli_b") == 0  # in another of the 4 slots: a's stays
    assert ask("cli_a") > 0
