"""A store that cannot write answers 503 Unavailable, never hangs, corrupts or half-writes."""
from __future__ import annotations

import sqlite3
import threading

import pytest

from lmsp.errors import Unavailable
from lmsp.store import Store
from lmsp.store.db import Database
from store_checks import assert_consistent


def test_lock_held_past_the_busy_timeout_is_unavailable(db_path, clock):
    s = Store.open(db_path, busy_timeout=0.1, clock=clock)
    created = s.create_task(client_id=None, model="m", request={}, on_restart="fail", background=True, stream=False)
    holder = sqlite3.connect(db_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(Unavailable) as info:
            s.create_task(client_id=None, model="m", request={}, on_restart="fail", background=True, stream=False)
        assert info.value.status == 503 and info.value.headers["Retry-After"] == "1"
        assert info.value.body()["error"]["code"] == "unavailable"
        with pytest.raises(Unavailable):
            s.cancel(created["task"]["id"])
        # readers are not blocked by a writer in WAL mode
        assert s.get_task(created["task"]["id"])["status"] == "queued"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert s.cancel(created["task"]["id"])["status"] == "cancelled"
    assert len(s.list_tasks(limit=10)["data"]) == 1
    s.close()


@pytest.mark.parametrize("pragma", ["query_only = 1", "max_page_count = {pages}"])
def test_full_or_read_only_disk_is_unavailable_and_changes_nothing(db_path, clock, monkeypatch, pragma):
    s = Store.open(db_path, clock=clock)
    ok = s.create_task(client_id=None, model="m", request={}, on_restart="fail", background=True, stream=False)
    s.close()
    pages = sqlite3.connect(db_path).execute("PRAGMA page_count").fetchone()[0]
    real_connect = Database.connect

    def crippled(self):
        conn = real_connect(self)
        conn.execute("PRAGMA " + pragma.format(pages=pages))
        return conn

    monkeypatch.setattr(Database, "connect", crippled)
    s = Store.open(db_path, clock=clock)
    big = {"input": "x" * 200_000}  # needs new pages
    with pytest.raises(Unavailable):
        s.create_task(client_id=None, model="m", request=big, on_restart="fail", background=True, stream=False)
    s.close()
    monkeypatch.setattr(Database, "connect", real_connect)
    s = Store.open(db_path, clock=clock)
    assert [t["id"] for t in s.list_tasks(limit=10)["data"]] == [ok["task"]["id"]]
    assert_consistent(s, ok["task"]["id"])
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    s.close()


def test_threads_share_one_store(store, make_task):
    tids = [make_task()["task"]["id"] for _ in range(40)]
    errors: list[BaseException] = []
    claimed: list[list[str]] = []

    def worker(name: str) -> None:
        mine = []
        try:
            while True:
                claims = store.claim(name, limit=2, lease=30)
                if not claims:
                    break
                for c in claims:
                    store.set_running(c["task_id"], name)
                    mine.append(c["task_id"])
                for i in range(3):
                    store.append_step(name, [{"task_id": c["task_id"], "delta": f"{name}{i}", "tokens": [i],
                                              "finish": "stop" if i == 2 else None} for c in claims])
        except BaseException as exc:  # reported below
            errors.append(exc)
        claimed.append(mine)

    threads = [threading.Thread(target=worker, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    flat = [t for mine in claimed for t in mine]
    assert sorted(flat) == sorted(tids)
    for tid in tids:
        assert store.get_task(tid)["status"] == "completed"
        assert_consistent(store, tid)
