"""Parallel function calls of a ``resume`` task on a real service (the demo model
under the calls grammar) killed inside the second call's arguments: after the
restart the task continues exactly, each call once, as the uninterrupted run."""
from __future__ import annotations

import time

import pytest
from e2e_helpers import FINISHED, check_log

NOTE = {
    "type": "function",
    "name": "save_note",
    "description": "Saves a note.",
    "parameters": {"type": "object", "properties": {"note": {"type": "string", "minLength": 500, "maxLength": 1000}},
                   "required": ["note"], "additionalProperties": False},
}
BODY = {"model": "tiny", "input": "Count on:", "tools": [NOTE], "tool_choice": "required", "max_tool_calls": 2,
        "max_output_tokens": 3000, "temperature": 0}
ARGS = "response.function_call_arguments.delta"


def arguments(events: list[dict], index: int) -> str:
    return "".join(e["delta"] for e in events if e["type"] == ARGS and e["output_index"] == index)


def wait_inside_the_second_call(server, token, task_id, timeout: float = 120.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = server.events(token, task_id)
        if arguments(events, 1):
            return events
        time.sleep(0.02)
    raise AssertionError("the second call did not open")


@pytest.mark.slow  # a real service, crash and restart: seconds on 2 cores
def test_a_resume_task_killed_inside_the_second_calls_arguments_continues_exactly(make_server):
    server = make_server().start()
    token = server.pair()
    whole = server.call("POST", "/v1/responses", {**BODY, "on_restart": "fail"}, token=token)
    assert [i["type"] for i in whole["output"]] == ["function_call", "function_call"], whole["output"]
    created = server.call("POST", "/v1/responses", {**BODY, "background": True, "on_restart": "resume"},
                          token=token, expect=202)
    task_id = created["task"]["id"]
    before = arguments(wait_inside_the_second_call(server, token, task_id), 1)
    server.kill()
    assert 0 < len(before) < len(whole["output"][1]["arguments"])
    server.start()
    task = server.wait_task(token, task_id, lambda t: t["status"] in FINISHED, timeout=180)
    assert (task["status"], task["attempts"]) == ("completed", 2)
    events = server.events(token, task_id)
    types = check_log(events)
    assert types.count("task.resumed") == 1 and types.count("response.output_item.added") == 2
    response = server.call("GET", f"/v1/responses/{created['id']}", token=token)
    assert [(i["name"], i["arguments"]) for i in response["output"]] == [
        (i["name"], i["arguments"]) for i in whole["output"]]
    assert [arguments(events, i) for i in (0, 1)] == [i["arguments"] for i in whole["output"]]
    assert len({i["call_id"] for i in response["output"]}) == 2
