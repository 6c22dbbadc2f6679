"""A conversation on a real service whose worker is killed (SIGKILL) during a turn, for
each restart policy: the conversation holds exactly the turns that ended, once each,
and its next turn works; and a second turn created while one runs, from other
processes at the same moment, is refused with conversation_busy."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from e2e_helpers import FINISHED, start_running

LONG = {"model": "tiny", "input": "Count on:", "max_output_tokens": 1500, "temperature": 0}
SHORT = {"model": "tiny", "input": "Hello there", "max_output_tokens": 8, "temperature": 0}


def items(server, token, cid: str) -> list[dict]:
    page = server.call("GET", f"/v1/conversations/{cid}/items?order=asc&limit=100", token=token)
    assert page["has_more"] is False
    return page["data"]


def text_of(item: dict) -> str:
    return "".join(part.get("text", "") for part in item["content"])


@pytest.mark.slow  # a real service, crash or wait: seconds each on 2 cores
@pytest.mark.parametrize("policy", ["fail", "retry", "resume"])
def test_sigkill_of_the_worker_during_a_turn(make_server, policy):
    server = make_server().start()
    token = server.pair()
    cid = server.call("POST", "/v1/conversations", {}, token=token)["id"]
    first = server.call("POST", "/v1/responses", {**SHORT, "conversation": cid}, token=token)
    assert len(items(server, token, cid)) == 2
    tasks = start_running(server, token, {**LONG, "conversation": cid}, (policy,))
    [worker] = server.workers()
    os.kill(worker, signal.SIGKILL)  # gunicorn starts another; the dead one's task is recovered
    task = server.wait_task(token, tasks[policy], lambda t: t["status"] in FINISHED, timeout=180)
    assert task["status"] == ("failed" if policy == "fail" else "completed"), (task, server.log())
    response = server.call("GET", f"/v1/responses/{task['response_id']}", token=token)
    listed = items(server, token, cid)
    # the first turn, then the killed one once: its input and its output as the response has it
    assert [(i["role"], text_of(i)) for i in listed] == [
        ("user", "Hello there"), ("assistant", first["output"][0]["content"][0]["text"]),
        ("user", "Count on:"), ("assistant", response["output"][0]["content"][0]["text"])]
    assert listed[3]["id"] == response["output"][0]["id"]
    # the long turn fills the demo model's context: the next one drops the oldest turns of its prompt
    nxt = server.call("POST", "/v1/responses", {**SHORT, "conversation": cid, "truncation": "auto"}, token=token)
    assert nxt["status"] in ("completed", "incomplete") and nxt["conversation"] == {"id": cid}
    listed = items(server, token, cid)
    assert len(listed) == 6 and len({i["id"] for i in listed}) == 6


CREATE = """
import http.client, json, sys
port, token, body = int(sys.argv[1]), sys.argv[2], sys.argv[3]
sys.stdin.readline()  # every process starts its request at the same moment
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
conn.request("POST", "/v1/responses", body=body, headers={"Authorization": "Bearer " + token,
             "Content-Type": "application/json"})
answer = conn.getresponse()
print(json.dumps([answer.status, json.loads(answer.read())]))
"""


@pytest.mark.slow
def test_concurrent_turns_from_other_processes_get_conversation_busy(make_server):
    server = make_server().start()
    token = server.pair()
    cid = server.call("POST", "/v1/conversations", {}, token=token)["id"]
    body = json.dumps({**LONG, "conversation": cid, "background": True})
    procs = [subprocess.Popen([sys.executable, "-c", CREATE, str(server.port), token, body], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(6)]
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    answers = [json.loads(proc.communicate(timeout=90)[0]) for proc in procs]
    accepted = [a for a in answers if a[0] == 202]
    busy = [a for a in answers if a[0] == 409]
    assert len(accepted) == 1 and len(busy) == 5, answers
    assert {a[1]["error"]["code"] for a in busy} == {"conversation_busy"}
    rid = accepted[0][1]["id"]
    server.call("POST", f"/v1/responses/{rid}/cancel", token=token)
    server.wait_task(token, accepted[0][1]["task"]["id"], lambda t: t["status"] in FINISHED)
    assert [i["role"] for i in items(server, token, cid)][:1] == ["user"]
    again = server.call("POST", "/v1/responses", {**SHORT, "conversation": cid, "truncation": "auto"}, token=token)
    assert again["status"] in ("completed", "incomplete")


WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.mark.slow
def test_the_tool_loop_by_previous_response_id_across_a_restart(make_server):
    server = make_server().start()
    token = server.pair()
    call = server.call("POST", "/v1/responses", {**SHORT, "max_output_tokens": 64, "tools": [WEATHER],
                                                 "tool_choice": "required"}, token=token)
    [item] = call["output"]
    assert item["type"] == "function_call", call
    server.kill()
    server.start()
    output = {"type": "function_call_output", "call_id": item["call_id"], "output": "Sunny."}
    answer = server.call("POST", "/v1/responses", {**SHORT, "input": [output], "tools": [WEATHER],
                                                   "previous_response_id": call["id"]}, token=token)
    assert answer["status"] in ("completed", "incomplete") and answer["previous_response_id"] == call["id"]
    listed = server.call("GET", f"/v1/responses/{answer['id']}/input_items", token=token)["data"]
    assert [(i["type"], i["call_id"], i["output"]) for i in listed] == [("function_call_output", item["call_id"],
                                                                         "Sunny.")]
