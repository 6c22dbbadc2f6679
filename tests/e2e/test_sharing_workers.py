"""A client's queue limit under ``lmsp serve`` with two worker processes on one database:
requests sent at once, answered by either worker, admit exactly ``max_queued`` tasks and
refuse the others with 429; another client is not held back; each client's last-seen time
is written."""
from __future__ import annotations

import threading

MAX_QUEUED = 5
BACKGROUND = {"model": "tiny", "input": "hi", "background": True, "max_output_tokens": 4}


def test_max_queued_holds_across_two_workers(make_server):
    server = make_server(env={"LMSP_WORKERS": "2", "LMSP_N_PARALLEL": "1"}).start()
    assert len(server.workers()) == 2
    admin = server.pair(scopes="admin", name="operator")
    limited = server.pair(name="limited")
    other = server.pair(name="other")
    clients = {c["name"]: c for c in server.call("GET", "/v1/clients", token=admin)["data"]}
    server.call("PATCH", f"/v1/clients/{clients['limited']['id']}", {"max_running": 0, "max_queued": MAX_QUEUED},
                token=admin)
    answers: list[tuple[int, dict]] = []
    lock, start = threading.Lock(), threading.Barrier(16)

    def send() -> None:
        start.wait()
        answer = server.request("POST", "/v1/responses", BACKGROUND, token=limited, timeout=60)
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=send) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = sorted(status for status, _ in answers)
    assert statuses == [202] * MAX_QUEUED + [429] * (16 - MAX_QUEUED), answers
    assert {body["error"]["code"] for status, body in answers if status == 429} == {"rate_limited"}
    queued = server.call("GET", "/v1/tasks?status=queued&limit=100", token=limited)["data"]
    assert len(queued) == MAX_QUEUED  # nothing stored for a refused request
    done = server.call("POST", "/v1/responses", {**BACKGROUND, "background": False}, token=other)
    assert done["status"] in ("completed", "incomplete")
    seen = {c["name"]: c for c in server.call("GET", "/v1/clients", token=admin)["data"]}
    assert seen["limited"]["last_seen_at"] is not None and seen["other"]["last_seen_at"] is not None
