"""Under gevent, a store call waiting for a lock held by another process
blocks only its own greenlet: the rest of the worker keeps running."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import json, sys
    import gevent
    from lmsp.errors import Unavailable
    from lmsp.serving.hubsafe import HubSafeStore, hub_safe
    from lmsp.store import Store

    store = Store.open(sys.argv[1], busy_timeout=float(sys.argv[2]))
    safe = hub_safe(store)
    assert isinstance(safe, HubSafeStore)
    ticks = []
    done = []

    def ticker():
        while not done:
            ticks.append(1)
            gevent.sleep(0.01)

    def writer():
        try:
            safe.set_setting("probe", "1")
            done.append("written")
        except Unavailable as exc:
            done.append("unavailable")
        done.append(len(ticks))

    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()  # the lock is held now
    t = gevent.spawn(ticker)
    w = gevent.spawn(writer)
    w.join(); t.join()
    from lmsp.errors import NotFound
    try:
        safe.get_response("resp_00000000000000000000000000")
        missing = "found"
    except NotFound:
        missing = "not_found"
    print(json.dumps({"outcome": done[0], "ticks_while_waiting": done[1], "missing": missing}))
    """
)


def test_lock_wait_does_not_freeze_other_greenlets(tmp_path):
    from lmsp.store import Store

    db = tmp_path / "lmsp.db"
    Store.open(db).close()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(db), "1.0"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            child.stdin.write("go\n")
            child.stdin.flush()
            out, err = child.communicate(timeout=60)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
    finally:
        if child.poll() is None:
            child.kill()
    report = json.loads(out.strip().splitlines()[-1])
    assert report["outcome"] == "unavailable"
    # the ticker greenlet ran while the writer waited for the lock
    assert report["ticks_while_waiting"] > 1
    # expected errors reach the caller as exceptions, with nothing printed by the pool
    assert report["missing"] == "not_found"
    assert "Traceback" not in err, err


def test_outside_gevent_the_store_is_returned_as_is(tmp_path):
    from lmsp.serving.hubsafe import hub_safe
    from lmsp.store import Store

    store = Store.open(tmp_path / "lmsp.db")
    try:
        assert hub_safe(store) is store
    finally:
        store.close()


READER = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import json, sys
    import gevent
    import lmsp.serving.hubsafe as hubsafe
    from lmsp.errors import NotFound, Unavailable
    from lmsp.store import Store
    from lmsp.store import db as dbmod

    store = Store.open(sys.argv[1], busy_timeout=1.0)
    safe = hubsafe.hub_safe(store)
    pooled, hub = [], gevent.get_hub()
    in_pool = hubsafe._in_pool
    hubsafe._in_pool = lambda *args: pooled.append(1) or in_pool(*args)
    read, locked = store._db.read, []

    def read_or_lock():  # a lock, met only by reads that may not wait
        if locked and getattr(dbmod._no_wait, "on", False):
            raise Unavailable("database is locked")
        threads.append(gevent.getcurrent() is hub or gevent.get_hub() is not hub)
        return read()

    threads = []
    store._db.read = read_or_lock

    def get():
        try:
            safe.get_response("resp_00000000000000000000000000")
            return "found"
        except NotFound:
            return "not_found"

    free = get()
    free_pooled, free_threads = len(pooled), list(threads)
    locked.append(1)
    ticks, done = [], []

    def ticker():
        while not done:
            ticks.append(1)
            gevent.sleep(0.001)

    t = gevent.spawn(ticker)
    gevent.sleep(0.005)
    after_lock = get()
    done.append(1)
    t.join()
    print(json.dumps({"free": free, "free_pooled": free_pooled, "free_in_pool_thread": free_threads,
                      "locked": after_lock, "locked_pooled": len(pooled) - free_pooled,
                      "locked_in_pool_thread": threads[len(free_threads):]}))
    """
)


def test_reads_run_on_the_hub_and_go_to_the_pool_when_they_meet_a_lock(tmp_path):
    from lmsp.store import Store

    db = tmp_path / "lmsp.db"
    Store.open(db).close()
    done = subprocess.run([sys.executable, "-c", READER, str(db)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # no lock: answered on the hub's own thread, no pool involved
    assert report["free"] == "not_found" and report["free_pooled"] == 0
    assert report["free_in_pool_thread"] == [False]
    # a lock: the read failed at once and was made again in the pool, where it may wait
    assert report["locked"] == "not_found" and report["locked_pooled"] == 1
    assert report["locked_in_pool_thread"] == [True]
    assert "Traceback" not in done.stderr, done.stderr


def test_no_wait_reads_do_not_wait_and_refuse_writes(tmp_path):
    from lmsp.store import Store
    from lmsp.errors import Unavailable
    from lmsp.store.db import no_wait

    store = Store.open(tmp_path / "lmsp.db", busy_timeout=3.0)
    try:
        with no_wait():
            with store._db.read() as conn:
                assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 0
            with pytest.raises(RuntimeError):
                store.set_setting("k", "v")
        with store._db.read() as conn:
            assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 3000
        store.set_setting("k", "v")
        # with no idle connection, opening one (which sets WAL mode and may wait on a
        # lock) is not done without waiting: the read is refused, for the pool to make
        while store._db._idle:
            store._db._idle.pop().close()
        with no_wait():
            with pytest.raises(Unavailable):
                store.get_setting("k")
        assert store.get_setting("k") == "v"
    finally:
        store.close()


HUB_READS = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import json, sys
    import gevent
    from lmsp.config import Config
    from lmsp.serving.hubsafe import hub_safe
    from lmsp.runtime import Runtime
    from lmsp.runtime.state import Run
    from lmsp.store import Store

    store = Store.open(sys.argv[1], busy_timeout=120.0)  # a wait would outlast the test's guard
    tid = sys.argv[2]
    runtime = Runtime(Config(data_dir=sys.argv[3]).validated(), store, prepare=False)
    runtime.state.runs[tid] = Run(tid, "m", seq=7)  # a task this worker decodes
    for conn in list(store._db._idle):  # no idle connection: a read would have to open one
        conn.close()
    store._db._idle.clear()
    print("ready", flush=True)
    sys.stdin.readline()  # another process holds the database now
    runtime.wait_for_commit(tid, 0, 0.05)  # asks the store on the hub
    print("waited", flush=True)
    read = gevent.spawn(hub_safe(store).last_sequence, tid)  # meets the lock: waits in the pool
    gevent.sleep(0.05)
    print("hub free", flush=True)
    sys.stdin.readline()  # the holder let go
    print(json.dumps({"last": read.get()}), flush=True)
    """
)


def test_reads_on_the_hub_never_wait_out_a_lock(tmp_path):
    """A stream's or a plain request's wait asks the store on the gevent hub, and a read
    made without waiting may have to open a connection: neither may wait out a lock held
    by another process, which would stop every greenlet of the worker."""
    import select

    from lmsp.store import Store

    db = tmp_path / "lmsp.db"
    store = Store.open(db)
    tid = store.create_task(client_id=None, model="m", request={"model": "m", "input": "x"}, on_restart="fail",
                            background=True, stream=False)["task"]["id"]
    store.close()
    child = subprocess.Popen([sys.executable, "-c", HUB_READS, str(db), tid, str(tmp_path / "data")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def line() -> str:  # the guard: a hub stuck on the lock never answers
        ready, _, _ = select.select([child.stdout], [], [], 60)
        assert ready, "the child's hub is stuck"
        return child.stdout.readline().strip()

    try:
        assert line() == "ready"
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("PRAGMA locking_mode = EXCLUSIVE")  # readers wait too
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("CREATE TABLE IF NOT EXISTS held (x)")
        holder.execute("COMMIT")  # the exclusive lock stays until the connection closes
        try:
            child.stdin.write("go\n")
            child.stdin.flush()
            assert line() == "waited"
            assert line() == "hub free"
        finally:
            holder.close()
        child.stdin.write("go\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert json.loads(out.strip().splitlines()[-1]) == {"last": 2}, err
