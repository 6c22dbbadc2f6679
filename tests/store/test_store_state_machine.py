"""Property-based: random operations from several actors against a model of LMSP's rules.

The model says what each operation must do (B.7, 11.3, the claim and lease
rules); after every step the store must agree with it, every task's log must
be gapless, and no task whose cancel was accepted may complete.
"""
from __future__ import annotations

import itertools
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as stt
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from lmsp.errors import IllegalTransition, TaskFinished
from lmsp.store import FINISHED, TRANSITIONS, ClaimLost, Store
from store_checks import SPEC_RECOVERY, SPEC_TRANSITIONS, assert_consistent

WORKERS = ("w1", "w2", "w3")
LEASE = 10.0
RETENTION = 100.0
MAX_ATTEMPTS = 2  # B.12: starts of a task whose worker stops while it runs
PICKS = stt.lists(stt.tuples(stt.integers(0, 50),
                             stt.sampled_from((None, None, None, "stop", "length", "cancelled", "error")),
                             stt.sampled_from(("", "a", "xyz"))), min_size=1, max_size=4, unique_by=lambda p: p[0])
AIMED = stt.sampled_from((True, True, True, False))  # mostly aim at tasks where the operation is legal


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class StoreMachine(RuleBasedStateMachine):
    folder: Path  # set per test
    counter = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        path = self.folder / f"run{next(self.counter)}" / "lmsp.db"
        self.store = Store.open(path, durability="off", clock=self.clock)
        self.tasks: dict[str, dict] = {}  # model: id -> status, owner, lease, policy, finished_at
        self.order: list[str] = []         # creation order
        self.cancel_accepted: set[str] = set()

    def teardown(self) -> None:
        self.store.close()

    # -- helpers ---------------------------------------------------------------------------
    def pick(self, data_index: int, aim=None) -> str | None:
        """A task by index: among those ``aim(task)`` accepts when there are any (so the
        operation is likely to be legal), else among all."""
        live = [t for t in self.order if t in self.tasks]
        if aim is not None:
            live = [t for t in live if aim(self.tasks[t])] or live
        return live[data_index % len(live)] if live else None

    def end(self, t: dict, status: str) -> None:
        t.update(status=status, owner=None, lease=None, finished_at=self.clock.now)

    # -- rules -----------------------------------------------------------------------------
    @initialize()
    def start(self) -> None:
        assert self.store.recover(startup=True) == {"failed": [], "requeued": [], "resumed": [], "cancelled": [],
                                                    "exhausted": [], "kv_paths": []}

    @rule(policies=stt.lists(stt.sampled_from(("fail", "retry", "resume")), min_size=1, max_size=2))
    def create(self, policies: list[str]) -> None:
        for policy in policies:
            created = self.store.create_task(client_id="cli", model="m", request={}, on_restart=policy,
                                             background=True, stream=False)
            tid = created["task"]["id"]
            self.tasks[tid] = {"status": "queued", "owner": None, "lease": None, "policy": policy,
                               "finished_at": None, "attempts": 1}
            self.order.append(tid)
            self.clock.now += 0.5

    @rule(worker=stt.sampled_from(WORKERS), limit=stt.integers(1, 3))
    def claim(self, worker: str, limit: int) -> None:
        claimable = [t for t in self.order if t in self.tasks and self.tasks[t]["owner"] is None
                     and self.tasks[t]["status"] in ("queued", "running")][:limit]
        got = self.store.claim(worker, limit=limit, lease=LEASE)
        assert [c["task_id"] for c in got] == claimable
        for c in got:
            t = self.tasks[c["task_id"]]
            assert c["status"] == t["status"]
            assert (c["resume"] is not None) == (t["status"] == "running")
            t.update(owner=worker, lease=self.clock.now + LEASE)

    @rule(worker=stt.sampled_from(WORKERS), limit=stt.integers(1, 3), load=stt.booleans())
    def claim_and_start(self, worker: str, limit: int, load: bool) -> None:
        """What a worker does most: claim, (load,) run."""
        self.claim(worker, limit)
        for tid, t in self.tasks.items():
            if t["owner"] == worker and t["status"] in ("queued", "loading"):
                if load and t["status"] == "queued":
                    self.store.set_loading(tid, worker)
                self.store.set_running(tid, worker)
                t["status"] = "running"

    def _owned_change(self, method, worker: str, index: int, target: str, aimed: bool = False) -> None:
        tid = self.pick(index, (lambda t: t["owner"] == worker and t["status"] in ("queued", "loading"))
                        if aimed else None)
        if tid is None:
            return
        t = self.tasks[tid]
        if t["status"] == target and t["owner"] == worker:
            expected = None  # already there (a resumed task): nothing happens
        elif t["status"] != target and target not in SPEC_TRANSITIONS[t["status"]]:
            expected = IllegalTransition
        elif t["owner"] != worker:
            expected = ClaimLost
        else:
            expected = "ok"
        try:
            method(tid, worker)
        except IllegalTransition as exc:
            assert type(exc) is expected, (expected, exc)
            return
        assert expected in (None, "ok"), expected
        t["status"] = target

    @rule(worker=stt.sampled_from(WORKERS), index=stt.integers(0, 50), aimed=AIMED,
          goal=stt.sampled_from(("loading", "running")))
    def start_one(self, worker: str, index: int, aimed: bool, goal: str) -> None:
        method = self.store.set_loading if goal == "loading" else self.store.set_running
        self._owned_change(method, worker, index, goal, aimed=aimed)

    @rule(worker=stt.sampled_from(WORKERS), picks=PICKS, aimed=AIMED)
    def step(self, worker: str, picks, aimed: bool) -> None:
        items, expected_skip, expected_final = [], [], {}
        seen = set()
        if aimed:  # act as a worker that has something to step
            busy = [t["owner"] for t in self.tasks.values()
                    if t["owner"] is not None and t["status"] in ("running", "cancelling")]
            stopping = [t["owner"] for t in self.tasks.values() if t["owner"] and t["status"] == "cancelling"]
            if stopping and picks[0][0] % 2:  # often: the step that races a cancel
                busy = stopping
            worker = busy[picks[0][0] % len(busy)] if busy else worker
        aim = (lambda t: t["owner"] == worker and t["status"] in ("running", "cancelling")) if aimed else None
        for index, finish, delta in picks:
            tid = self.pick(index, aim)
            if tid is None or tid in seen:
                continue
            seen.add(tid)
            items.append({"task_id": tid, "delta": delta, "tokens": [1], "finish": finish})  # no text: held back
            t = self.tasks[tid]
            if t["owner"] != worker or t["status"] not in ("running", "cancelling"):
                expected_skip.append(tid)
            elif finish is not None:
                if t["status"] == "cancelling" or finish == "cancelled":
                    expected_final[tid] = "cancelled"
                else:
                    expected_final[tid] = "failed" if finish == "error" else "completed"
        if not items:
            return
        result = self.store.append_step(worker, items)
        assert result["skipped"] == expected_skip
        assert result["finished"] == expected_final
        assert sorted(result["cancelled"]) == sorted(t for t, s in expected_final.items() if s == "cancelled")
        for tid, status in expected_final.items():
            self.end(self.tasks[tid], status)

    another_step = rule(worker=stt.sampled_from(WORKERS), picks=PICKS, aimed=AIMED)(
        lambda self, worker, picks, aimed: self.step(worker, picks, aimed))

    @rule(index=stt.integers(0, 50), aimed=AIMED)
    def cancel(self, index: int, aimed: bool) -> None:
        tid = self.pick(index, (lambda t: t["status"] in ("loading", "running", "cancelling")) if aimed else None)
        if tid is None:
            return
        t = self.tasks[tid]
        if t["status"] in ("completed", "failed"):
            try:
                self.store.cancel(tid)
            except TaskFinished:
                return
            raise AssertionError("cancel of a finished task was accepted")
        got = self.store.cancel(tid)
        if t["status"] in ("queued", "loading") or (t["status"] == "running" and t["owner"] is None):
            self.end(t, "cancelled")
        elif t["status"] == "running":
            t["status"] = "cancelling"
        assert got["status"] == t["status"]
        self.cancel_accepted.add(tid)

    @rule(worker=stt.sampled_from(WORKERS), index=stt.integers(0, 50), aimed=AIMED)
    def fail_task(self, worker: str, index: int, aimed: bool) -> None:
        tid = self.pick(index, (lambda t: t["owner"] == worker) if aimed else None)
        if tid is None:
            return
        t = self.tasks[tid]
        try:
            self.store.fail_task(tid, worker, code="model_load_failed", message="x")
        except IllegalTransition as exc:
            if t["status"] in FINISHED:
                assert type(exc) is IllegalTransition
            else:
                assert type(exc) is ClaimLost and t["owner"] != worker
            return
        assert t["status"] not in FINISHED and t["owner"] == worker
        self.end(t, "cancelled" if t["status"] == "cancelling" else "failed")

    @rule(worker=stt.sampled_from(WORKERS),
          event=stt.sampled_from(("renew", "renew", "release", "die1", "die6", "die11", "restart")))
    def time_passes(self, worker: str, event: str) -> None:
        """Leases are renewed, a worker stops or dies, the service restarts."""
        if event == "renew":
            self.renew(worker)
        elif event == "release":
            self.release(worker)
        elif event == "restart":
            self.restart()
        else:
            self.worker_died(float(event[3:]))

    def renew(self, worker: str) -> None:
        got = self.store.renew(worker, lease=LEASE)
        mine = [tid for tid, t in self.tasks.items() if t["owner"] == worker and t["status"] not in FINISHED]
        for tid in mine:
            self.tasks[tid]["lease"] = self.clock.now + LEASE
        assert sorted(got) == sorted(tid for tid in mine if self.tasks[tid]["status"] == "cancelling")

    def release(self, worker: str) -> None:
        self.store.release(worker)
        for t in self.tasks.values():
            if t["owner"] == worker and t["status"] not in FINISHED:
                if t["status"] == "queued":
                    t.update(owner=None, lease=None)
                else:
                    t["lease"] = 0.0

    def _recover(self, tids: list[str], report: dict) -> None:
        """The 11.3 table, within the starts B.12 allows: only a task a worker had started
        counts one, and one started ``MAX_ATTEMPTS`` times fails with attempts_exhausted."""
        moved = {k: sorted(v) for k, v in report.items() if k != "kv_paths"}
        expected: dict[str, list[str]] = {"failed": [], "requeued": [], "resumed": [], "cancelled": [],
                                          "exhausted": []}
        for tid in tids:
            t = self.tasks[tid]
            started = t["status"] in ("loading", "running") and t["owner"] is not None
            target = SPEC_RECOVERY[(t["status"], t["policy"])]
            if started and t["attempts"] >= MAX_ATTEMPTS:
                target = "failed"
                expected["exhausted"].append(tid)
            key = {"failed": "failed", "cancelled": "cancelled", "queued": "requeued", "running": "resumed"}[target]
            expected[key].append(tid)
            if target in FINISHED:
                self.end(t, target)
            else:
                t.update(status=target, owner=None, lease=None, attempts=t["attempts"] + int(started))
        assert moved == {k: sorted(v) for k, v in expected.items()}
        for tid in tids:
            task = self.store.get_task(tid)
            assert task["attempts"] == self.tasks[tid]["attempts"], (tid, task)
            if tid in expected["exhausted"]:
                assert task["error"]["code"] == "attempts_exhausted"
            elif task["status"] == "failed":
                assert task["error"]["code"] == "server_restarted"

    def worker_died(self, seconds: float) -> None:
        self.clock.now += seconds
        doomed = [tid for tid, t in self.tasks.items() if t["owner"] is not None and t["status"] not in FINISHED
                  and t["lease"] < self.clock.now]
        self._recover(doomed, self.store.recover(startup=False, max_attempts=MAX_ATTEMPTS))

    def restart(self) -> None:
        doomed = [tid for tid, t in self.tasks.items() if t["status"] not in FINISHED]
        self._recover(doomed, self.store.recover(startup=True, max_attempts=MAX_ATTEMPTS))

    @precondition(lambda self: self.tasks)
    @rule(seconds=stt.sampled_from((0.0, 50.0, 150.0)))
    def gc(self, seconds: float) -> None:
        self.clock.now += seconds
        self.store.gc(retention=RETENTION, batch=3)
        for tid, t in list(self.tasks.items()):
            if t["status"] in FINISHED and t["finished_at"] < self.clock.now - RETENTION:
                del self.tasks[tid]

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def store_agrees_with_the_model(self) -> None:
        listed = self.store.list_tasks(limit=100)
        assert sorted(t["id"] for t in listed["data"]) == sorted(self.tasks)
        for tid, t in self.tasks.items():
            assert self.store.get_task(tid)["status"] == t["status"]
            assert_consistent(self.store, tid)
            if tid in self.cancel_accepted:
                assert t["status"] in ("cancelling", "cancelled")


def test_random_operations_keep_every_rule(tmp_path):
    StoreMachine.folder = tmp_path
    run_state_machine_as_test(StoreMachine, settings=settings(
        max_examples=60, stateful_step_count=40, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


def test_the_stores_transitions_are_the_contracts():
    assert {state: set(targets) for state, targets in TRANSITIONS.items()} == SPEC_TRANSITIONS
