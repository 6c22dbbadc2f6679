"""Schema versions: an older database migrates, a newer one is refused."""
from __future__ import annotations

import sqlite3

import pytest

from lmsp.store import SCHEMA_VERSION, Store, StoreError
from lmsp.store.db import PAGE_SIZE
from lmsp.store.schema import migrate


def test_fresh_database_has_the_current_version_and_pragmas(db_path):
    s = Store.open(db_path)
    s.close()
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"service_config", "clients", "models", "responses", "tasks", "task_events",
            "idempotency_keys", "pairings"} <= tables
    conn.close()


def test_older_database_is_migrated_with_its_data(db_path):
    db_path.parent.mkdir(parents=True)
    conn = sqlite3.connect(db_path, isolation_level=None)
    migrate(conn, target=1)
    conn.execute("INSERT INTO clients (id, name, scopes, token_hash, created_at) "
                 "VALUES ('cli_old', 'old', '[\"admin\"]', 'h', 1)")
    conn.close()
    s = Store.open(db_path)  # a file of SQLite's default page size keeps it
    assert s.client_by_token_hash("h")["id"] == "cli_old"
    s.create_pairing(code_hash="c", scopes=["admin"], expires_at=2e9)  # a table of version 2
    s.close()
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_newer_database_is_refused_untouched(db_path):
    s = Store.open(db_path)
    s.close()
    conn = sqlite3.connect(db_path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        Store.open(db_path)
    conn = sqlite3.connect(db_path, isolation_level=None)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    # the newer service writing at that moment: the same answer, not a lock timeout
    conn.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreError, match="newer"):
            Store.open(db_path, busy_timeout=0.2)
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def test_a_file_that_is_not_a_database_is_refused(db_path):
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError):
        Store.open(db_path)


def test_bad_durability_is_refused(db_path):
    with pytest.raises(ValueError, match="durability"):
        Store.open(db_path, durability="sometimes")


@pytest.mark.parametrize("durability,expected", [("full", 2), ("normal", 1), ("off", 0)])
def test_durability_sets_synchronous(db_path, durability, expected):
    s = Store.open(db_path, durability=durability)
    assert s.durability == durability
    conn = s._db.connect()
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == expected
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    conn.close()
    s.close()


def test_version_2_tasks_keep_their_counters_without_the_copied_column(db_path, clock):
    """Migration 3: a task's counter is its last event's number; the tasks row stops copying it."""
    db_path.parent.mkdir(parents=True)
    conn = sqlite3.connect(db_path, isolation_level=None)
    migrate(conn, target=2)
    conn.close()
    # a task written by the version-2 layout: its row carries last_seq = 2
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("INSERT INTO responses (id, model, created_at, request, background, stream, item_id) "
                 "VALUES ('resp_1', 'm', 1, '{}', 1, 0, 'msg_1')")
    conn.execute("INSERT INTO tasks (id, response_id, model, status, on_restart, created_at, last_seq) "
                 "VALUES ('task_1', 'resp_1', 'm', 'queued', 'fail', 1, 2)")
    for seq, etype in ((1, "response.created"), (2, "response.queued")):
        conn.execute("INSERT INTO task_events (task_id, seq, type, created_at, data) VALUES (?,?,?,1,'{}')",
                     ("task_1", seq, etype))
    conn.close()
    s = Store.open(db_path, clock=clock)
    try:
        assert s.last_sequence("task_1") == 2
        assert s.get_task("task_1")["last_sequence_number"] == 2
        s.cancel("task_1")
        assert s.last_sequence("task_1") == 3
        assert [e["sequence_number"] for e in s.events("task_1")["data"]] == [1, 2, 3]
    finally:
        s.close()
    conn = sqlite3.connect(db_path)
    columns = {r[1] for r in conn.execute("PRAGMA table_info(tasks)")}
    conn.close()
    assert ("last_seq" in columns) == (sqlite3.sqlite_version_info < (3, 35, 0))


def test_version_4_models_get_an_unrecorded_chat_template(db_path):
    """Migration 5: a model registered before it knows nothing of its chat template (None),
    and a registration records it."""
    db_path.parent.mkdir(parents=True)
    conn = sqlite3.connect(db_path, isolation_level=None)
    migrate(conn, target=4)
    conn.execute("INSERT INTO models (id, path, digest, size_bytes, created_at) "
                 "VALUES ('old', 'old.gguf', 'sha256:' || hex(zeroblob(32)), 1, 1)")
    conn.close()
    s = Store.open(db_path)
    try:
        assert s.get_model("old")["has_chat_template"] is None
        model = dict(s.get_model("old"), has_chat_template=True)
        assert s.put_model(model)["has_chat_template"] is True
        assert s.put_model(dict(model, has_chat_template=False))["has_chat_template"] is False
    finally:
        s.close()
