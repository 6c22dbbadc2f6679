"""A turn of a ``previous_response_id`` chain on a real service killed (SIGKILL) midway:
its prompt is read again from the chain's kept turns, after an older response of the
chain was deleted, and the ``resume`` and ``retry`` tasks end with the text of a run
never killed."""
from __future__ import annotations

import pytest
from e2e_helpers import FINISHED, deltas, resumed_text, start_running, uninterrupted_text

LONG = {"model": "tiny", "input": "Count on:", "max_output_tokens": 1500, "temperature": 0}
SHORT = {"model": "tiny", "input": "Hello there", "max_output_tokens": 8, "temperature": 0}


@pytest.mark.slow  # a real service, crash and restart: seconds on 2 cores
def test_a_chained_turn_killed_midway_reads_the_same_prompt_again(make_server):
    server = make_server().start()
    token = server.pair()
    first = server.call("POST", "/v1/responses", SHORT, token=token)
    second = server.call("POST", "/v1/responses", {**SHORT, "input": "And again",
                                                   "previous_response_id": first["id"]}, token=token)
    body = {**LONG, "previous_response_id": second["id"]}
    tasks = start_running(server, token, body, ("retry", "resume"))
    before = {policy: deltas(server.events(token, task_id)) for policy, task_id in tasks.items()}
    server.call("DELETE", f"/v1/responses/{first['id']}", token=token)  # its turn stays in the chain
    server.kill()
    server.start()
    expected = uninterrupted_text(server, token, body)
    assert resumed_text(server, token, tasks["resume"], before["resume"]) == expected
    retried = server.wait_task(token, tasks["retry"], lambda t: t["status"] in FINISHED, timeout=180)
    assert retried["status"] == "completed" and retried["attempts"] == 2, (retried, server.log())
    response = server.call("GET", f"/v1/responses/{retried['response_id']}", token=token)
    assert response["output"][0]["content"][0]["text"] == expected
