"""A graceful stop (SIGTERM): new work is refused on every connection, running tasks get
their grace period, and open streams end with an event that says so."""
from __future__ import annotations

import http.client
import json
import os
import signal
import time

import pytest
from e2e_helpers import Server, deltas, sse_events

from lmsp.models.demo import write_demo_model

# a context long enough for tasks that outlast a short grace period
LONG = {"LMSP_N_CTX": "16384", "LMSP_MAX_OUTPUT_TOKENS_CAP": "12000", "LMSP_N_PARALLEL": "2"}
COUNT = {"model": "tiny", "input": "Count on:", "temperature": 0}
TERMINAL = ("response.completed", "response.incomplete")


@pytest.fixture
def make_long_server(tmp_path):
    (tmp_path / "model").mkdir()
    model = write_demo_model(tmp_path / "model" / "tiny.gguf", n_ctx=16384)
    made = []

    def make(grace: float) -> Server:
        root = tmp_path / f"svc{len(made)}"
        root.mkdir()
        server = Server(root / "data", root, model, {**LONG, "LMSP_STOP_GRACE_SECONDS": str(grace)})
        made.append(server)
        return server.start()

    yield make
    for server in made:
        server.stop(timeout=10)


def wait_for(what: str, ok, server: Server, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s\n{server.log()}")
        time.sleep(0.05)


def sigterm(server: Server) -> None:
    """SIGTERM to the master, as systemd sends it; returns once the worker drains."""
    server.proc.send_signal(signal.SIGTERM)
    wait_for("the worker drains", lambda: "draining: no more claims" in server.log(tail=1 << 20), server)


def exit_status(server: Server, timeout: float = 60.0) -> int:
    status = server.proc.wait(timeout=timeout)
    server.proc = None
    return status


@pytest.mark.slow  # a stop that waits for a running task
def test_a_stopping_service_refuses_new_work_and_lets_running_tasks_finish(make_long_server):
    server = make_long_server(grace=60)
    token = server.pair()
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    body = {**COUNT, "max_output_tokens": 2000, "background": True}  # some seconds on the demo model
    created = server.call("POST", "/v1/responses", body, token=token, expect=202)
    task_id = created["task"]["id"]
    server.wait_task(token, task_id, lambda t: t["status"] == "running" and t["last_sequence_number"] >= 10)
    kept = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)   # a keep-alive connection
    kept.request("GET", "/healthz")
    assert kept.getresponse().read() and server.call("GET", f"/v1/tasks/{task_id}", token=token)["status"] == "running"

    sigterm(server)
    kept.request("POST", "/v1/responses", body=json.dumps({**body, "max_output_tokens": 8}), headers=auth)
    refused = kept.getresponse()
    payload = json.loads(refused.read())
    kept.close()
    assert refused.status == 503, payload
    assert payload["error"]["code"] == "unavailable" and int(refused.getheader("Retry-After")) >= 1

    assert exit_status(server) == 0   # no connection held the worker meanwhile: the task did
    server.start()
    task = server.call("GET", f"/v1/tasks/{task_id}", token=token)
    assert task["status"] == "completed" and task["attempts"] == 1, task   # it finished before the stop
    assert [t["id"] for t in server.call("GET", "/v1/tasks", token=token)["data"]] == [task_id]  # nothing else stored


@pytest.mark.slow  # a stop, its grace period and a restart
def test_an_open_stream_ends_with_a_stopping_event_and_resumes_after_the_restart(make_long_server):
    server = make_long_server(grace=1)
    token = server.pair()
    body = {**COUNT, "max_output_tokens": 6000, "stream": True, "on_restart": "resume"}
    seen = []
    for event in sse_events("127.0.0.1", server.port, "POST", "/v1/responses", token=token, body=body, timeout=60):
        seen.append(event)
        if [e["type"] for e in seen].count("response.output_text.delta") == 3:
            server.proc.send_signal(signal.SIGTERM)   # the task has thousands of tokens to go
    # the stream ended with the stopping event, then the connection closed
    assert seen[-1]["type"] == "error" and seen[-1]["code"] == "server_stopping", seen[-3:]
    assert all(e["type"] not in TERMINAL for e in seen)
    assert exit_status(server) == 0

    response_id = seen[0]["response"]["id"]
    last = seen[-2]["sequence_number"]
    assert f"sequence number {last}" in seen[-1]["message"]
    server.start()
    rest = list(sse_events("127.0.0.1", server.port, "GET",
                           f"/v1/responses/{response_id}?stream=true&starting_after={last}", token=token,
                           timeout=120))
    assert rest[-1]["type"] in TERMINAL, rest[-3:]
    numbers = [e["sequence_number"] for e in rest]
    assert numbers == sorted(set(numbers)) and numbers[0] > last
    final = server.call("GET", f"/v1/responses/{response_id}", token=token)
    assert deltas(seen[:-1] + rest) == final["output"][0]["content"][0]["text"]   # nothing lost, nothing twice
    task = server.call("GET", f"/v1/tasks/{final['task']['id']}", token=token)
    assert task["attempts"] == 2   # it ran on after the restart, where it stopped


def test_a_stop_signal_to_every_process_at_once_winds_down_cleanly(make_long_server):
    """systemd's default stop (KillMode=control-group) and `pkill` send SIGTERM to
    the master and its worker together, and the master passes its own on: the
    worker's handler runs twice, the second time inside the first. The worker
    still winds down without an error, and the service exits with status 0."""
    server = make_long_server(grace=2)
    workers = server.workers()
    assert workers
    for pid in workers:
        os.kill(pid, signal.SIGTERM)
    server.proc.send_signal(signal.SIGTERM)
    assert exit_status(server) == 0
    log = server.log(tail=1 << 20)
    assert "Exception in worker process" not in log, log
    assert "Traceback" not in log, log


@pytest.mark.slow  # a stop, its grace period and a restart
def test_a_chat_stream_cut_by_the_stop_asks_for_the_request_again(make_long_server):
    """A chat completion's chunks carry no numbers and its restart policy is fail: its
    stopping error offers no resume, and after the restart its task has failed."""
    server = make_long_server(grace=1)
    token = server.pair()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Count on:"}], "max_tokens": 6000,
            "temperature": 0, "stream": True, "store": True}
    seen = []
    for chunk in sse_events("127.0.0.1", server.port, "POST", "/v1/chat/completions", token=token, body=body,
                            timeout=60):
        seen.append(chunk)
        if sum(1 for c in seen if c.get("choices") and c["choices"][0]["delta"].get("content")) == 3:
            server.proc.send_signal(signal.SIGTERM)   # the task has thousands of tokens to go
    error = seen[-1]["error"]
    assert error["code"] == "server_stopping" and seen[0]["id"] in error["message"], seen[-3:]
    assert "send the request again" in error["message"] and "sequence number" not in error["message"]
    assert exit_status(server) == 0
    server.start()
    stored = server.call("GET", f"/v1/chat/completions/{seen[0]['id']}", token=token)
    assert stored["task"]["status"] == "failed" and stored["error"]["code"] == "server_restarted", stored
