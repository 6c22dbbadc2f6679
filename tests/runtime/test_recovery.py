"""Crashes, restarts and dead workers (LMSP 11.3, B.9) on the real store and engine."""
from __future__ import annotations

import os
import stat

import pytest
from runtime_helpers import all_events, check_log, deltas, submit, wait_finished, wait_until

from lmsp.runtime import open_store, prepare


def crash_mid_run(store, make_runtime, on_restart, *, min_seq=10):
    """A runtime generates a long answer, then dies (no commit, no release) mid-run."""
    rt = make_runtime(store)
    rt.register_model("tiny.gguf")
    task_id = submit(store, rt, "Count on:", on_restart=on_restart, max_output_tokens=1500)
    wait_until(rt, store, task_id, lambda t: t["last_sequence_number"] >= min_seq)
    rt.abort()
    task = store.get_task(task_id)
    assert task["status"] == "running"
    return task_id, deltas(all_events(store, task_id)), task["last_sequence_number"]


def test_resume_after_a_crash_continues_without_emitting_again(config, store, make_runtime, model_file):
    task_id, before, last_seq = crash_mid_run(store, make_runtime, "resume")
    assert before
    restarted = open_store(config)  # the next service start
    rt = None
    try:
        report = restarted.recover(startup=True)
        assert report["resumed"] == [task_id]
        rt = make_runtime(restarted)
        task = wait_finished(rt, restarted, task_id)
        assert task["status"] == "completed"
        assert task["attempts"] == 2
        events = all_events(restarted, task_id)
        types = check_log(events)
        assert types[last_seq] == "task.resumed"
        assert types.count("response.output_item.added") == 1
        text = deltas(events)
        assert text.startswith(before) and len(text) > len(before)
        assert text == restarted.output_text(task_id)
        assert events[-4]["text"] == text  # output_text.done carries the whole text
        usage = restarted.get_response(task["response_id"])["usage"]
        assert usage["output_tokens"] == 1500 or types[-1] == "response.completed"
        # greedy on the CPU: the resumed answer is the answer an uninterrupted run gives
        reference = submit(restarted, rt, "Count on:", max_output_tokens=1500)
        wait_finished(rt, restarted, reference)
        assert restarted.output_text(reference) == text
    finally:
        if rt is not None:
            rt.stop()
        restarted.close()


def test_retry_after_a_crash_starts_the_output_again(config, store, make_runtime, model_file):
    task_id, before, last_seq = crash_mid_run(store, make_runtime, "retry")
    report = store.recover(startup=True)
    assert report["requeued"] == [task_id]
    rt = make_runtime(store)
    task = wait_finished(rt, store, task_id)
    assert task["status"] == "completed"
    events = all_events(store, task_id)
    types = check_log(events)
    assert types[last_seq] == "task.requeued"
    after = deltas(events[last_seq:])
    assert after == store.output_text(task_id)
    assert after.startswith(before)  # greedy: the same answer again, from the start


def test_fail_after_a_crash_fails_with_server_restarted(config, store, make_runtime, model_file):
    task_id, _, _ = crash_mid_run(store, make_runtime, "fail")
    assert store.recover(startup=True)["failed"] == [task_id]
    task = store.get_task(task_id)
    assert task["status"] == "failed"
    assert task["error"]["code"] == "server_restarted"
    assert check_log(all_events(store, task_id))[-1] == "response.failed"


@pytest.mark.parametrize("policy", ["resume", "retry", "fail"])
def test_a_dead_workers_task_is_recovered_when_its_lease_expires(config, store, make_runtime, model_file,
                                                                policy):
    survivor_store = open_store(config)  # another worker process: its own connections
    survivor = None
    try:
        # started once the task is claimed by the worker that dies: running, its idle
        # scheduler's round (every IDLE_WAIT) could claim the task first and run it to the end
        survivor = make_runtime(survivor_store, start=False)
        task_id, before, _ = crash_mid_run(store, make_runtime, policy)
        survivor.start()
        # nobody restarts the service: the survivor's lease check finds the task (lease 1 s)
        task = wait_finished(survivor, survivor_store, task_id)
        events = all_events(survivor_store, task_id)
        types = check_log(events)
        if policy == "fail":
            assert task["status"] == "failed"
            assert task["error"]["code"] == "server_restarted"
        else:
            assert task["status"] == "completed"
            assert ("task.resumed" if policy == "resume" else "task.requeued") in types
            assert survivor_store.output_text(task_id).startswith(before)
            if policy == "resume":
                assert deltas(events) == survivor_store.output_text(task_id)
    finally:
        if survivor is not None:
            survivor.stop()
        survivor_store.close()


def test_a_graceful_stop_leaves_running_tasks_to_their_restart_policy(config, store, make_runtime, model_file):
    rt = make_runtime(store)
    rt.register_model("tiny.gguf")
    task_id = submit(store, rt, "Count on:", on_restart="resume", max_output_tokens=1500)
    wait_until(rt, store, task_id, lambda t: t["last_sequence_number"] >= 10)
    rt.stop()
    stopped = store.get_task(task_id)
    assert stopped["status"] == "running"  # hundreds of tokens were still to come: left as it was
    assert store.recover(startup=True)["resumed"] == [task_id]  # its policy, at the next start
    rt2 = make_runtime(store)
    task = wait_finished(rt2, store, task_id)
    assert task["status"] == "completed" and task["attempts"] == 2
    events = all_events(store, task_id)
    types = check_log(events)
    assert types.count("task.resumed") == 1
    assert deltas(events) == store.output_text(task_id)


def test_first_start_makes_the_admin_credential_and_the_demo_model(config, store):
    report = prepare(config, store)
    assert set(report) >= {"failed", "requeued", "resumed", "cancelled"}
    token_file = config.admin_token_path
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    token = token_file.read_text().strip()
    from lmsp import auth
    client = store.client_by_token_hash(auth.hash_token(token))
    assert client is not None and client["scopes"] == ["admin"]
    models = store.list_models()
    assert [m["id"] for m in models] == ["demo"]
    assert (config.models_dir / "demo.gguf").is_file()
    # a second start changes nothing
    prepare(config, store)
    assert token_file.read_text().strip() == token
    assert len(store.list_clients()) == 1
    assert [m["id"] for m in store.list_models()] == ["demo"]


def test_a_model_given_by_the_operator_is_registered_by_its_file_name(config, store, demo_model_path):
    cfg = config.replace(model=str(demo_model_path))
    prepare(cfg, store)
    assert [m["id"] for m in store.list_models()] == [demo_model_path.name[:-len(".gguf")]]
    assert not (config.models_dir / "demo.gguf").exists()
