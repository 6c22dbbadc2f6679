"""Schema versions: an older database migrates, a newer one is refused."""
from __future__ import annotations

import sqlite3

import pytest

from lmsp.store import SCHEMA_VERSION, Store, StoreError
from lmsp.store.schema import migrate


def test_fresh_database_has_the_current_version_and_pragmas(db_path):
    s = Store.open(db_path)
    s.close()
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
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
    s = Store.open(db_path)
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
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
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
