"""The schema: DDL constants plus numbered migrations tracked in ``PRAGMA user_version``.

``MIGRATIONS[i]`` brings a database from version ``i`` to ``i + 1``. Opening an
older database applies the missing ones, each in its own transaction; a
database written by a newer version of the service is refused.
"""

from __future__ import annotations

import sqlite3
from typing import Callable

from .db import StoreError

SERVICE_CONFIG = """
CREATE TABLE service_config (
    key    TEXT PRIMARY KEY,
    value  TEXT NOT NULL              -- JSON
) WITHOUT ROWID"""

CLIENTS = """
CREATE TABLE clients (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    scopes      TEXT NOT NULL,        -- JSON list
    token_hash  TEXT NOT NULL UNIQUE, -- sha256 hex of the bearer token; never the token
    created_at  REAL NOT NULL,
    revoked_at  REAL
)"""

MODELS = """
CREATE TABLE models (
    id              TEXT PRIMARY KEY,
    path            TEXT NOT NULL,    -- the file stays outside the database
    digest          TEXT NOT NULL,    -- sha256:<hex>
    size_bytes      INTEGER NOT NULL,
    format          TEXT NOT NULL DEFAULT 'gguf',
    architecture    TEXT,
    parameters      INTEGER,
    quantization    TEXT,
    context_length  INTEGER,
    state           TEXT NOT NULL DEFAULT 'available',
    created_at      REAL NOT NULL
)"""

RESPONSES = """
CREATE TABLE responses (
    id                 TEXT PRIMARY KEY,
    client_id          TEXT,
    model              TEXT NOT NULL,
    created_at         REAL NOT NULL,
    request            TEXT NOT NULL,  -- JSON, as validated by the web layer
    background         INTEGER NOT NULL,
    stream             INTEGER NOT NULL,
    item_id            TEXT NOT NULL,  -- msg_ id of the output message
    output_text        TEXT,           -- set when the task finishes
    usage              TEXT,           -- JSON
    incomplete_reason  TEXT
)"""

TASKS = """
CREATE TABLE tasks (
    id              TEXT PRIMARY KEY,
    response_id     TEXT NOT NULL UNIQUE REFERENCES responses(id) ON DELETE CASCADE,
    client_id       TEXT,
    model           TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN
                        ('queued','loading','running','cancelling','completed','failed','cancelled')),
    on_restart      TEXT NOT NULL CHECK (on_restart IN ('fail','retry','resume')),
    attempts        INTEGER NOT NULL DEFAULT 1,
    created_at      REAL NOT NULL,
    started_at      REAL,
    finished_at     REAL,
    error           TEXT,              -- JSON {"code","message"}
    last_seq        INTEGER NOT NULL DEFAULT 0,  -- dropped by migration 3
    owner           TEXT,              -- the worker holding the claim
    lease_expires   REAL,
    attempt_seq     INTEGER NOT NULL DEFAULT 0,  -- output of this attempt starts after it
    item_open       INTEGER NOT NULL DEFAULT 0,  -- output_item.added written this attempt
    pending_tokens  TEXT NOT NULL DEFAULT '',    -- generated ids whose text is not emitted yet
    kv_path         TEXT
)"""

TASK_EVENTS = """
CREATE TABLE task_events (
    task_id     TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    type        TEXT NOT NULL,
    created_at  REAL NOT NULL,
    text        TEXT,                 -- the delta of an output_text.delta event
    tokens      TEXT,                 -- token ids of that delta, comma separated (resume snapshot)
    data        TEXT,                 -- JSON payload of every other event
    PRIMARY KEY (task_id, seq)
) WITHOUT ROWID"""

IDEMPOTENCY_KEYS = """
CREATE TABLE idempotency_keys (
    client_id    TEXT NOT NULL,
    key          TEXT NOT NULL,
    fingerprint  TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('processing','done','task')),
    status       INTEGER,
    body         TEXT,                -- JSON
    task_id      TEXT,
    created_at   REAL NOT NULL,
    expires_at   REAL NOT NULL,
    PRIMARY KEY (client_id, key)
) WITHOUT ROWID"""

PAIRINGS = """
CREATE TABLE pairings (
    id          TEXT PRIMARY KEY,
    code_hash   TEXT NOT NULL UNIQUE,
    name        TEXT,
    scopes      TEXT NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL NOT NULL,
    used_at     REAL,
    client_id   TEXT
)"""

PAIRING_FAILURES = """
CREATE TABLE pairing_failures (
    id  INTEGER PRIMARY KEY,
    at  REAL NOT NULL
)"""

RESPONSE_ITEMS = """
CREATE TABLE response_items (
    response_id  TEXT NOT NULL REFERENCES responses(id) ON DELETE CASCADE,
    pos          INTEGER NOT NULL,    -- 0.. in the order of the request's input
    item_id      TEXT NOT NULL,       -- msg_, fc_, fco_, rs_ ...
    data         TEXT NOT NULL,       -- JSON: the item as listed
    PRIMARY KEY (response_id, pos)
) WITHOUT ROWID"""

CONVERSATIONS = """
CREATE TABLE conversations (
    id          TEXT PRIMARY KEY,
    client_id   TEXT,
    created_at  REAL NOT NULL,
    metadata    TEXT NOT NULL,        -- JSON object of strings
    version     INTEGER NOT NULL DEFAULT 0,  -- counts the changes of its items
    busy_task   TEXT                  -- the task of the response in progress, if any
)"""

CONVERSATION_ITEMS = """
CREATE TABLE conversation_items (
    conversation_id  TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    pos              INTEGER NOT NULL,  -- order in the conversation; never reused
    item_id          TEXT NOT NULL,
    data             TEXT NOT NULL,     -- JSON: the item as listed
    created_at       REAL NOT NULL,
    PRIMARY KEY (conversation_id, pos)
) WITHOUT ROWID"""

INDEXES_V6 = [
    "CREATE INDEX response_items_id ON response_items(response_id, item_id)",
    "CREATE INDEX conversation_items_id ON conversation_items(conversation_id, item_id)",
    "CREATE INDEX conversations_client ON conversations(client_id, id)",
    "CREATE INDEX conversations_busy ON conversations(busy_task) WHERE busy_task IS NOT NULL",
]

CHAINS = """
CREATE TABLE chains (
    id         TEXT PRIMARY KEY,      -- the id of the chain's first response
    newest_at  REAL NOT NULL          -- its newest response's creation or end
)"""

CHAIN_TURNS = """
CREATE TABLE chain_turns (
    response_id  TEXT PRIMARY KEY,    -- the response continued (it may be deleted since)
    chain_id     TEXT NOT NULL,
    parent_id    TEXT,                -- the turn before it; NULL for the first
    messages     TEXT NOT NULL,       -- JSON: its messages as a later prompt reads them
    calls        TEXT NOT NULL        -- JSON: call id -> name of the calls they make
) WITHOUT ROWID"""

MIGRATION_V7: list[str | Callable[[sqlite3.Connection], None]] = [
    "ALTER TABLE tasks ADD COLUMN chain_id TEXT",
    CHAINS,
    CHAIN_TURNS,
    # gc(): finished tasks in no chain by age; a chain goes by its newest time
    "DROP INDEX tasks_finished",
    "CREATE INDEX tasks_finished ON tasks(finished_at) WHERE finished_at IS NOT NULL AND chain_id IS NULL",
    "CREATE INDEX tasks_chain ON tasks(chain_id) WHERE chain_id IS NOT NULL",
    "CREATE INDEX chains_newest ON chains(newest_at, id)",
    "CREATE INDEX chain_turns_chain ON chain_turns(chain_id)",
]

INDEXES_V1 = [
    # claim(): unowned queued tasks and resumable running ones, oldest first
    "CREATE INDEX tasks_claimable ON tasks(created_at, id) WHERE owner IS NULL AND status IN ('queued','running')",
    # renew(), release(), recover(startup=False)
    "CREATE INDEX tasks_owner ON tasks(owner, lease_expires) WHERE owner IS NOT NULL",
    # recover(startup=True), list_tasks(status=), metrics by state
    "CREATE INDEX tasks_status ON tasks(status, created_at)",
    # gc(): finished tasks by age
    "CREATE INDEX tasks_finished ON tasks(finished_at) WHERE finished_at IS NOT NULL",
    # delete_model(): unfinished tasks of a model
    "CREATE INDEX tasks_model ON tasks(model, status)",
    "CREATE INDEX tasks_client ON tasks(client_id, id)",
    "CREATE INDEX responses_client ON responses(client_id, id)",
    "CREATE INDEX idempotency_expiry ON idempotency_keys(expires_at)",
    "CREATE INDEX idempotency_task ON idempotency_keys(task_id) WHERE task_id IS NOT NULL",
]

INDEXES_V2 = [
    "CREATE INDEX pairings_expiry ON pairings(expires_at)",
    "CREATE INDEX pairing_failures_at ON pairing_failures(at)",
]


def _drop_task_counter(conn: sqlite3.Connection) -> None:
    """A task's sequence counter is the number of its last event (``lmsp.store.base``), so
    the column that repeated it goes. SQLite before 3.35 cannot drop a column: there it
    stays, unread and unwritten."""
    if sqlite3.sqlite_version_info >= (3, 35, 0):
        conn.execute("ALTER TABLE tasks DROP COLUMN last_seq")


MIGRATION_V8: list[str | Callable[[sqlite3.Connection], None]] = [
    # the order tasks start in (lmsp.store.sharing): tasks queued before it keep theirs (0, then by time)
    "ALTER TABLE tasks ADD COLUMN start_tag REAL NOT NULL DEFAULT 0",
    "CREATE INDEX tasks_start_order ON tasks(start_tag, created_at, id)"
    " WHERE owner IS NULL AND status IN ('queued','running')",
    # a client's newest tag and its waiting tasks, at each creation
    "CREATE INDEX tasks_client_tags ON tasks(client_id, start_tag)"
    " WHERE status IN ('queued','loading','running','cancelling')",
    "ALTER TABLE clients ADD COLUMN priority INTEGER NOT NULL DEFAULT 1",
    "ALTER TABLE clients ADD COLUMN max_running INTEGER",
    "ALTER TABLE clients ADD COLUMN max_queued INTEGER",
    "ALTER TABLE clients ADD COLUMN tokens_per_hour INTEGER",
    """CREATE TABLE client_usage (
    client_id   TEXT NOT NULL,
    hour        INTEGER NOT NULL,     -- Unix seconds // 3600
    tasks       INTEGER NOT NULL DEFAULT 0,
    tokens      INTEGER NOT NULL DEFAULT 0,  -- input and output tokens of its finished tasks
    PRIMARY KEY (client_id, hour)
) WITHOUT ROWID""",
    "CREATE INDEX client_usage_hour ON client_usage(hour)",
]

MIGRATION_V9: list[str | Callable[[sqlite3.Connection], None]] = [
    # the service's own history (lmsp.store.history): one row a minute per worker
    """CREATE TABLE service_history (
    minute          INTEGER NOT NULL,     -- Unix seconds // 60: the minute the row counts
    worker          TEXT NOT NULL,        -- the worker's name in the claims
    tokens          INTEGER NOT NULL DEFAULT 0,  -- generated in the minute
    tasks_finished  INTEGER NOT NULL DEFAULT 0,
    errors          INTEGER NOT NULL DEFAULT 0,  -- tasks that failed
    ttft            TEXT,                 -- JSON [[upper bound ms or null, count], ...]; NULL: none
    queued          INTEGER NOT NULL DEFAULT 0,  -- tasks queued in the store when written
    running         INTEGER NOT NULL DEFAULT 0,  -- sequences the worker was decoding
    db_bytes        INTEGER,
    kv_bytes        INTEGER,
    model_bytes     INTEGER,
    PRIMARY KEY (minute, worker)
) WITHOUT ROWID""",
]


# a step: an SQL statement, or a function of the connection for what SQL alone cannot say
MIGRATIONS: list[list[str | Callable[[sqlite3.Connection], None]]] = [
    # 1: the task store
    [SERVICE_CONFIG, CLIENTS, MODELS, RESPONSES, TASKS, TASK_EVENTS, IDEMPOTENCY_KEYS, *INDEXES_V1],
    # 2: pairing codes and the failed-attempt log
    [PAIRINGS, PAIRING_FAILURES, *INDEXES_V2],
    # 3: the task row no longer copies its counter
    [_drop_task_counter],
    # 4: a client's unfinished tasks, counted at each creation (a per-client cap)
    [
        "CREATE INDEX tasks_unfinished_client ON tasks(client_id) "
        "WHERE status IN ('queued','loading','running','cancelling')"
    ],
    # 5: whether a model's file declares a chat template (1 or 0; NULL for a
    # model registered before it was recorded)
    ["ALTER TABLE models ADD COLUMN chat_template INTEGER"],
    # 6: a response's input items, conversations and their items
    [RESPONSE_ITEMS, CONVERSATIONS, CONVERSATION_ITEMS, *INDEXES_V6],
    # 7: chains of responses: their turns kept once, and retention by a chain's newest time
    MIGRATION_V7,
    # 8: sharing the box: a task's fair start tag, a client's priority and limits,
    # its tokens per hour
    MIGRATION_V8,
    # 9: the service's own history, a row a minute per worker
    MIGRATION_V9,
    # 10: when a client's token was last used (lmsp.store.accounts.note_seen)
    ["ALTER TABLE clients ADD COLUMN last_seen_at REAL"],
    # 11: the RPC servers a model's layers are split over, and their shares (JSON; NULL: the
    # service's rpc_servers setting)
    ["ALTER TABLE models ADD COLUMN rpc_split TEXT"],
]

SCHEMA_VERSION = len(MIGRATIONS)


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _check_not_newer(version: int, path: str) -> None:
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} has schema version {version}, newer than this service understands "
            f"({SCHEMA_VERSION}); upgrade lmsp or use another data directory"
        )


def migrate(conn: sqlite3.Connection, *, target: int = SCHEMA_VERSION, path: str = "database") -> list[int]:
    """Bring the database to ``target``; return the versions applied.

    Each migration runs in one ``BEGIN IMMEDIATE`` transaction together with
    its ``user_version`` bump, so concurrent openers apply it exactly once.
    """
    applied: list[int] = []
    found = user_version(conn)
    if found == target:  # the common case needs no write lock
        return applied
    _check_not_newer(found, path)  # before the lock: a newer service may be writing
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = user_version(conn)
            _check_not_newer(version, path)
            if version >= target:
                conn.execute("COMMIT")
                return applied
            for step in MIGRATIONS[version]:
                if callable(step):
                    step(conn)
                else:
                    conn.execute(step)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
            applied.append(version + 1)
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
