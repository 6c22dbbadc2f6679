"""A real service killed mid-generation: restart policies (11.3) and dead workers (B.9)."""
from __future__ import annotations

import os
import signal
import threading

import pytest
from e2e_helpers import (
    FINISHED,
    check_log,
    check_stream,
    deltas,
    response_events,
    resumed_text,
    sse_events,
    start_running,
    uninterrupted_text,
)

LONG = {"model": "tiny", "input": "Count on:", "background": True, "max_output_tokens": 1500, "temperature": 0}


def start_long_tasks(server, token, policies):
    return start_running(server, token, LONG, policies)


def finished(task):
    return task["status"] in FINISHED


@pytest.mark.slow  # a real service, crash or wait: seconds each on 2 cores
def test_sigkill_mid_generation_then_restart_follows_each_policy(make_server):
    server = make_server().start()
    token = server.pair()
    tasks = start_long_tasks(server, token, ("fail", "retry", "resume"))
    before = {policy: deltas(server.events(token, task_id)) for policy, task_id in tasks.items()}
    server.kill()
    server.start()

    failed = server.wait_task(token, tasks["fail"], finished)
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "server_restarted"
    assert check_log(server.events(token, tasks["fail"]))[-1] == "response.failed"

    retried = server.wait_task(token, tasks["retry"], finished)
    assert retried["status"] == "completed", (retried, server.log())
    assert retried["attempts"] == 2
    events = server.events(token, tasks["retry"])
    types = check_log(events)
    text = server.call("GET", f"/v1/responses/{retried['response_id']}", token=token)["output"][0]["content"][0]["text"]
    restart = len(types) - 1 - types[::-1].index("task.requeued")
    assert deltas(events[restart:]) == text  # the output started again after task.requeued
    assert text.startswith(before["retry"])
    expected = uninterrupted_text(server, token, LONG)
    assert text == expected
    assert resumed_text(server, token, tasks["resume"], before["resume"]) == expected


@pytest.mark.slow  # a real service, crash or wait: seconds each on 2 cores
def test_killing_a_worker_recovers_its_tasks_without_a_restart(make_server):
    server = make_server().start()
    token = server.pair()
    master = server.proc.pid
    [worker] = server.workers()
    tasks = start_long_tasks(server, token, ("resume", "fail"))
    os.kill(worker, signal.SIGKILL)

    resumed = server.wait_task(token, tasks["resume"], finished)
    failed = server.wait_task(token, tasks["fail"], finished)
    assert server.proc.pid == master and server.proc.poll() is None  # the service never restarted
    assert worker not in server.workers()
    assert resumed["status"] == "completed"
    events = server.events(token, tasks["resume"])
    types = check_log(events)
    assert "task.resumed" in types
    response = server.call("GET", f"/v1/responses/{resumed['response_id']}", token=token)
    assert deltas(events) == response["output"][0]["content"][0]["text"]
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "server_restarted"


@pytest.mark.slow  # a real service, crash or wait: seconds each on 2 cores
def test_a_graceful_stop_and_start_resumes_running_tasks(make_server):
    # no grace period: the tasks are still running when the workers stop
    server = make_server(env={"LMSP_STOP_GRACE_SECONDS": "0"}).start()
    token = server.pair()
    tasks = start_long_tasks(server, token, ("resume", "fail"))
    server.stop()  # SIGTERM: workers commit what they produced and release their claims
    server.start()
    resumed = server.wait_task(token, tasks["resume"], finished)
    assert resumed["status"] == "completed"
    events = server.events(token, tasks["resume"])
    assert "task.resumed" in check_log(events)
    response = server.call("GET", f"/v1/responses/{resumed['response_id']}", token=token)
    assert deltas(events) == response["output"][0]["content"][0]["text"]
    failed = server.wait_task(token, tasks["fail"], finished)
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_restarted"


def test_two_workers_share_the_queue_through_the_store(make_server):
    server = make_server(env={"LMSP_WORKERS": "2", "LMSP_N_PARALLEL": "2"}).start()
    assert len(server.workers()) == 2
    token = server.pair()
    ids = []
    for i in range(6):
        created = server.call("POST", "/v1/responses", {"model": "tiny", "input": f"Item {i}:", "background": True,
                                                         "max_output_tokens": 200, "temperature": 0},
                              token=token, expect=202)
        ids.append(created["task"]["id"])
    for task_id in ids:
        task = server.wait_task(token, task_id, finished)
        assert task["status"] == "completed" and task["attempts"] == 1
        events = server.events(token, task_id)
        types = check_log(events)
        assert types.count("task.running") == 1
        assert deltas(events) == events[-4]["text"]


def test_streams_of_queued_tasks_follow_them_on_either_worker(make_server):
    """Streams opened while their tasks wait in the queue get every event, in order,
    once some worker runs them: the stream's own worker or the other one."""
    server = make_server(env={"LMSP_WORKERS": "2", "LMSP_N_PARALLEL": "1"}).start()
    token = server.pair()
    created = [server.call("POST", "/v1/responses", {"model": "tiny", "input": f"Item {i}:", "background": True,
                                                      "max_output_tokens": 120, "temperature": 0},
                           token=token, expect=202) for i in range(6)]
    streamed: dict[str, list] = {}

    def follow(response):
        path = f"/v1/responses/{response['id']}?stream=true"
        streamed[response["task"]["id"]] = list(sse_events("127.0.0.1", server.port, "GET", path, token=token,
                                                           timeout=60))

    threads = [threading.Thread(target=follow, args=(r,)) for r in created]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(streamed) == len(created)
    for response in created:
        task_id = response["task"]["id"]
        task = server.wait_task(token, task_id, finished)
        assert task["status"] == "completed"
        events = streamed[task_id]
        check_stream(events)
        log = server.events(token, task_id)
        check_log(log)
        assert events == response_events(log)
