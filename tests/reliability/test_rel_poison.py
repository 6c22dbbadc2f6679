"""The poison round (LMSP B.12): tasks that kill or hang their worker every time one runs
them end ``failed`` with ``attempts_exhausted`` after ``max_attempts`` starts, whatever
their policy, and every other task acknowledged in the same run completes.

The test plays the poison against a real ``lmsp serve`` (gunicorn, one gevent worker):
whenever the worker holds the round's poison tasks on a new attempt (their rows say
which process owns them), it SIGKILLs that worker, or stops it with SIGSTOP so that
gunicorn's timeout kills it. The next worker recovers the tasks through their expired
leases. Short tasks of every policy are sent in each cycle and finish before the next
death, so a death never counts against them.
"""
from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from rel_checker import FINISHED, StoreView, check_log, open_live

POLICIES = ("fail", "retry", "resume")
# greedy on the demo model: thousands of tokens, far longer than a cycle of the round
LONG = {"model": "demo", "input": "Count on:", "max_output_tokens": 4096, "temperature": 0}
SHORT = {"model": "demo", "input": "Hello", "max_output_tokens": 8, "temperature": 0}
GUNICORN_TIMEOUT = 8  # seconds a stopped worker lives on (a worker boots well within it)


def rows(data_dir: Path, ids: list[str]) -> dict[str, sqlite3.Row]:
    conn = open_live(data_dir)
    try:
        marks = ",".join("?" * len(ids))
        return {r["id"]: r for r in conn.execute(
            f"SELECT id, status, owner, attempts FROM tasks WHERE id IN ({marks})", ids)}
    finally:
        conn.close()


def holder(row: sqlite3.Row) -> int | None:
    """The pid of the worker that holds the task started (``loading`` or ``running``)."""
    if row["status"] not in ("loading", "running") or not row["owner"]:
        return None
    return int(row["owner"].rsplit(":", 2)[1])  # HOST:PID:ID


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def create(client, body: dict, policy: str) -> str:
    made = client.post("/v1/responses", {**body, "background": True, "on_restart": policy})
    assert made.status == 202, made.body
    return made.body["task"]["id"]


class Round:
    def __init__(self, server, client, max_attempts: int) -> None:
        self.server, self.client, self.max_attempts = server, client, max_attempts
        self.others: list[str] = []  # the tasks that must complete
        self.deaths = 0

    def innocents(self) -> None:
        """A short task of each policy in the background, and one answered at once: all done
        before the next death."""
        self.others += [create(self.client, SHORT, policy) for policy in POLICIES]
        done = self.client.post("/v1/responses", {**SHORT, "on_restart": "retry"})
        assert done.status == 200 and done.body["task"]["status"] == "completed", done.body  # at its length

    def held(self, live: dict[str, str], attempt: int, deadline: float) -> int:
        """Wait until one worker holds every live poison task on ``attempt`` and the other
        tasks are done; that worker's pid."""
        while True:
            self.server.check_alive()
            found = rows(self.server.data_dir, [*live.values(), *self.others])
            poison = [found[tid] for tid in live.values()]
            for row in poison:
                assert row["status"] not in FINISHED, f"poison task {row['id']} ended {row['status']} by itself"
            pids = {holder(row) for row in poison}
            pid = pids.pop() if len(pids) == 1 else None
            if (pid is not None and alive(pid) and all(row["attempts"] == attempt for row in poison)
                    and all(found[tid]["status"] in FINISHED for tid in self.others)):
                return pid
            assert time.monotonic() < deadline, (attempt, [dict(r) for r in found.values()],
                                                 self.server.log_tail())
            time.sleep(0.05)

    def poison(self, how: signal.Signals) -> dict[str, str]:
        """Poison tasks of every policy, their worker killed (or stopped) at each of their
        starts until none is left; their task ids by policy."""
        tasks = {policy: create(self.client, LONG, policy) for policy in POLICIES}
        live = dict(tasks)
        attempt = 1
        deadline = time.monotonic() + 300
        while live:
            self.innocents()
            pid = self.held(live, attempt, deadline)
            os.kill(pid, how)  # SIGSTOP: gunicorn's timeout kills it (SIGABRT, then SIGKILL)
            while alive(pid):
                assert time.monotonic() < deadline, f"worker {pid} never died"
                time.sleep(0.05)
            self.deaths += 1
            for policy in list(live):
                if policy == "fail" or attempt >= self.max_attempts:  # no start left for it
                    del live[policy]
            attempt += 1
        return tasks

    def finished(self, ids: list[str], timeout: float = 120.0) -> dict[str, dict]:
        deadline = time.monotonic() + timeout
        out: dict[str, dict] = {}
        for tid in ids:
            while True:
                got = self.client.get(f"/v1/tasks/{tid}")
                assert got.status == 200, got.body
                if got.body["status"] in FINISHED:
                    out[tid] = got.body
                    break
                assert time.monotonic() < deadline, (got.body, self.server.log_tail())
                time.sleep(0.1)
        return out


def failed_event(client, response_id: str) -> dict:
    """The last event of the response's stream (it has ended)."""
    with client.stream("GET", f"/v1/responses/{response_id}?stream=true") as (status, _, events):
        assert status == 200
        seen = [e.data for e in events]
    return seen[-1]


@pytest.mark.slow  # a real service whose worker dies 2 to 4 times, twice by gunicorn's timeout: about a minute
@pytest.mark.parametrize("max_attempts", [1, 2])
def test_poison_tasks_stop_after_max_attempts_and_the_rest_completes(make_server, max_attempts):
    server = make_server(env={"LMSP_LEASE_SECONDS": "2", "LMSP_WORKERS": "1",
                              "LMSP_GUNICORN_TIMEOUT": str(GUNICORN_TIMEOUT)},
                         extra_args=["--max-attempts", str(max_attempts)])
    server.start()
    client = server.pair(["responses:write", "responses:read"], name="poison")
    master = server.master_pid()
    rnd = Round(server, client, max_attempts)
    killed = rnd.poison(signal.SIGKILL)
    hung = rnd.poison(signal.SIGSTOP)
    assert "WORKER TIMEOUT" in server.log.read_text(errors="replace")  # gunicorn's timeout killed them
    assert rnd.deaths == 2 * max_attempts

    for group in (killed, hung):
        final = rnd.finished(list(group.values()))
        for policy, tid in group.items():
            task = final[tid]
            exhausted = policy != "fail" or max_attempts == 1  # fail: its row while attempts remain
            code = "attempts_exhausted" if exhausted else "server_restarted"
            starts = max_attempts if policy != "fail" else 1
            assert (task["status"], task["error"]["code"], task["attempts"]) == ("failed", code, starts), task
            if exhausted:
                message = task["error"]["message"]
                assert f"{starts} starts" in message and f"max_attempts ({max_attempts})" in message
            event = failed_event(client, task["response_id"])
            assert event["type"] == "response.failed" and event["response"]["error"] == task["error"]

    # every other acknowledged task completed, and the service runs new work with the same master
    rnd.innocents()
    others = rnd.finished(rnd.others)
    assert [(t["status"], t["attempts"]) for t in others.values()] == [("completed", 1)] * len(others)
    assert server.master_pid() == master and len(server.worker_pids()) == 1
    conn = open_live(server.data_dir)
    try:
        view = StoreView.load(conn)
    finally:
        conn.close()
    assert check_log(view) == []
