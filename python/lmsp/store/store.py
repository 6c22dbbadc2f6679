"""The durable store: LMSP chapter 11 on SQLite.

One :class:`Store` per process wraps one database file. Every write is one
``BEGIN IMMEDIATE`` transaction (see :mod:`lmsp.store.db`), so several worker
processes and threads can share the file: claims, cancels, sequence numbers
and idempotency decisions are all made inside the transaction that writes them.

:class:`Store` is a facade composed of one class per area, each in a module of
its own and each derived from :class:`~lmsp.store.base.StoreBase` (the
database, the clock, the id maker and the task log's primitives):

========================  ===================================================
:mod:`.accounts`          identity, settings, clients, pairings
:mod:`.models`            model metadata
:mod:`.tasks`             creating, cancelling and deleting responses
:mod:`.reads`             reads of tasks, responses and events
:mod:`.idempotency`       idempotency keys (B.8)
:mod:`.worker`            claims, leases, a task's start, ``fail_task``, ``release``
:mod:`.steps`             ``append_step`` (its rows: :mod:`.steprows`)
:mod:`.recovery`          the 11.3 table applied to leftover tasks
:mod:`.retention`         ``gc`` (B.10)
:mod:`.items`             a response's input items, and the pages of item lists
:mod:`.conversations`     conversations and their items (B.11)
:mod:`.history`           the service's own history, a row a minute per worker
========================  ===================================================

The areas are mixins rather than objects the facade holds: they share one
state (a transaction often spans areas: a new task, its idempotency key and
its claim are one write), every public name stays a method of ``Store`` with
no forwarding code, and what callers change on a store (its clock, in tests)
is seen by every area at once.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Callable

from .. import ids as _ids
from .accounts import AccountsArea
from .conversations import ConversationsArea
from .db import Database, translate
from .history import HistoryArea
from .idempotency import IdempotencyArea
from .items import ItemsArea
from lmsp.store.kv import KvOwnersArea
from .models import ModelsArea
from .reads import ReadsArea
from .recovery import RecoveryArea
from .retention import RetentionArea
from .schema import migrate
from .steps import StepsArea
from .tasks import TasksArea
from .worker import WorkerArea


class Store(
    AccountsArea,
    ModelsArea,
    ReadsArea,
    TasksArea,
    IdempotencyArea,
    WorkerArea,
    StepsArea,
    RecoveryArea,
    RetentionArea,
    ItemsArea,
    ConversationsArea,
    KvOwnersArea,
    HistoryArea,
):
    """The service's state in one SQLite file (see the module docstring of :mod:`lmsp.store.db`
    for what each ``durability`` level risks)."""

    # Methods that only read (one deferred transaction, no write): lmsp.serving.hubsafe
    # runs them on the gevent hub itself, failing fast on a lock, and only
    # sends them to its thread pool when a lock is met.
    READS = frozenset(
        {
            "events",
            "last_sequence",
            "last_sequences",
            "get_task",
            "get_response",
            "task_id_for_response",
            "client_by_token_hash",
            "get_model",
            "list_models",
            "list_responses",
            "list_tasks",
            "output_text",
            "client_active",
            "revoked_client_ids",
            "client_limits",
            "usage",
            "list_input_items",
            "input_item_list",
            "get_conversation",
            "conversation_items",
            "list_conversation_items",
            "get_conversation_item",
        }
    )

    # -- life cycle ------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        *,
        durability: str = "full",
        busy_timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
        new_id: Callable[[str], str] = _ids.new_id,
        idempotency_ttl: float = 24 * 3600.0,
    ) -> "Store":
        """Open (creating and migrating as needed) the database at ``path``.

        A database of a newer schema raises :class:`lmsp.store.StoreError`; a
        locked or unwritable one :class:`lmsp.errors.Unavailable`.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        db = Database(path, durability=durability, busy_timeout=busy_timeout)
        store = cls(db, clock=clock, new_id=new_id, idempotency_ttl=idempotency_ttl)
        try:
            conn = db._acquire()
            try:
                migrate(conn, path=str(path))
            except sqlite3.Error as exc:
                raise translate(exc) from exc
            finally:
                db._release(conn)
            store.identity()
        except BaseException:
            db.close()
            raise
        return store

    def close(self) -> None:
        """Close every idle connection; later calls raise RuntimeError. Safe to call twice."""
        self._db.close()

    @property
    def path(self) -> Path:
        return self._db.path

    @property
    def durability(self) -> str:
        return self._db.durability
