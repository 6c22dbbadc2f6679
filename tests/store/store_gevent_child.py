"""Run as a script: gevent greenlets and a real OS thread share one Store (as in a gunicorn worker)."""
from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402

import gevent  # noqa: E402

from lmsp.errors import TaskFinished  # noqa: E402
from lmsp.store import Store  # noqa: E402


def main(path: str) -> int:
    store = Store.open(path, durability="normal")
    created: list[str] = []
    clients_done: list[bool] = []
    real_sleep = monkey.get_original("time", "sleep")

    def client(n: int) -> None:  # a web request handler
        for i in range(15):
            r = store.create_task(client_id="cli", model="m", request={"i": i}, on_restart="fail",
                                  background=True, stream=False)
            created.append(r["task"]["id"])
            if i % 5 == 4:
                try:
                    store.cancel(r["task"]["id"])
                except TaskFinished:  # the real thread finished it first: B.7's 409
                    pass
            gevent.sleep(0)

    def engine() -> int:  # the commit thread: a real OS thread, not a greenlet
        done = 0
        while True:
            claims = store.claim("engine", limit=4, lease=60)
            if not claims:
                if clients_done:
                    return done
                real_sleep(0.001)
                continue
            for c in claims:
                try:
                    store.set_running(c["task_id"], "engine")
                except Exception:  # cancelled meanwhile
                    pass
            for step in range(3):
                result = store.append_step("engine", [
                    {"task_id": c["task_id"], "delta": "t", "tokens": [step], "finish": "stop" if step == 2 else None}
                    for c in claims])
                done += len(result["finished"])
        return done

    pool = gevent.get_hub().threadpool
    engine_result = pool.spawn(engine)
    gevent.joinall([gevent.spawn(client, n) for n in range(8)], raise_error=True)
    clients_done.append(True)
    finished = engine_result.get(timeout=120)
    bad = []
    for tid in created:
        task = store.get_task(tid)
        events = store.events(tid, limit=1000)["data"]
        if [e["sequence_number"] for e in events] != list(range(1, task["last_sequence_number"] + 1)):
            bad.append(tid)
        if task["status"] not in ("completed", "cancelled"):
            bad.append(tid)
    store.close()
    print(f"tasks {len(created)} finished-by-engine {finished} bad {bad}")
    return 1 if bad or len(created) != 120 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
