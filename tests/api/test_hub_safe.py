"""Under gevent, a store call waiting for a lock held by another process
blocks only its own greenlet: the rest of the worker keeps running."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import json, sys
    import gevent
    from lmsp.errors import Unavailable
    from lmsp.hubsafe import HubSafeStore, hub_safe
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
    from lmsp.hubsafe import hub_safe
    from lmsp.store import Store

    store = Store.open(tmp_path / "lmsp.db")
    try:
        assert hub_safe(store) is store
    finally:
        store.close()
