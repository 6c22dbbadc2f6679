"""Entry points of the child processes of the store tests (started with spawn)."""
from __future__ import annotations

import random

from lmsp.errors import IdempotencyKeyInUse, LMSPError, TaskFinished
from lmsp.store import Store


def claimer(path: str, owner: str, barrier, conn) -> None:
    store = Store.open(path, durability="normal")
    barrier.wait()
    got: list[str] = []
    while True:
        claims = store.claim(owner, limit=3, lease=60)
        if not claims:
            break
        got += [c["task_id"] for c in claims]
    conn.send(got)
    store.close()


def completer(path: str, task_ids: list[str], barrier, conn) -> None:
    store = Store.open(path, durability="normal")
    outcomes = []
    for tid in task_ids:
        barrier.wait()
        result = store.append_step("w", [{"task_id": tid, "delta": "x", "tokens": [1], "finish": "stop"}])
        outcomes.append(result["finished"].get(tid, "skipped"))
    conn.send(outcomes)
    store.close()


def canceller(path: str, task_ids: list[str], barrier, conn) -> None:
    store = Store.open(path, durability="normal")
    outcomes = []
    for tid in task_ids:
        barrier.wait()
        try:
            outcomes.append(store.cancel(tid)["status"])
        except TaskFinished:
            outcomes.append("finished")
    conn.send(outcomes)
    store.close()


def idempotent_sender(path: str, keys: list[str], background: bool, barrier, conn) -> None:
    store = Store.open(path, durability="normal")
    outcomes = []
    for key in keys:
        barrier.wait()
        try:
            r = store.create_task(client_id="cli_a", model="m", request={"input": key}, on_restart="fail",
                                  background=background, stream=False, idempotency=(key, "fp-" + key))
            outcomes.append(("created", r["task"]["id"]) if r["replay"] is None else ("replay", r["task"]["id"]))
        except IdempotencyKeyInUse:
            outcomes.append(("in_use", None))
    conn.send(outcomes)
    store.close()


def crash_writer(path: str, seed: int, conn) -> None:
    """Write tasks and events forever; report an ack only after the commit returned."""
    rng = random.Random(seed)
    store = Store.open(path)  # durability "full", the default
    owner = f"child-{seed}"
    conn.send(("ready",))
    running: list[str] = []
    while True:
        op = rng.random()
        try:
            if op < 0.3:
                r = store.create_task(client_id="cli_a", model="m", request={"n": rng.random()},
                                      on_restart=rng.choice(("fail", "retry", "resume")),
                                      background=True, stream=False)
                conn.send(("task", r["task"]["id"], r["task"]["last_sequence_number"]))
            elif op < 0.45:
                for claim in store.claim(owner, limit=3, lease=600):
                    if rng.random() < 0.5:
                        store.set_loading(claim["task_id"], owner)
                        if rng.random() < 0.2:
                            continue  # leave it loading
                    store.set_running(claim["task_id"], owner)
                    running.append(claim["task_id"])
            elif op < 0.9 and running:
                step = rng.sample(running, min(len(running), rng.randint(1, 4)))
                items = []
                for tid in step:
                    finish = rng.choice((None,) * 6 + ("stop", "length", "error"))
                    items.append({"task_id": tid, "delta": rng.choice(("", "a", "bc", "déf")),
                                  "tokens": [rng.randrange(1000)], "finish": finish,
                                  "kv_path": f"snapshots/{tid}.kv" if rng.random() < 0.1 else None})
                result = store.append_step(owner, items)
                for tid in list(result["finished"]) + result["skipped"]:
                    if tid in running:
                        running.remove(tid)
                for tid in step:
                    conn.send(("seq", tid, store.last_sequence(tid)))
            elif running:
                tid = rng.choice(running)
                conn.send(("seq", tid, store.cancel(tid)["last_sequence_number"]))
        except LMSPError:
            pass
