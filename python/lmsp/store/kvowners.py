"""What owns a KV file (:mod:`lmsp.kvfiles`): the conversation or the chain of
responses whose turn wrote it. A task's file is tagged with its chain's id
(``tasks.chain_id``) or, for a response created with a conversation, that
conversation's id; a task in neither owns nothing (its file is governed by the
budget alone). A file whose owner the store no longer holds is deleted by the
janitor's next round and by ``lmsp gc``."""

from __future__ import annotations

from typing import Iterable

from .base import StoreBase

CHUNK = 500  # ids a query names at most (SQLite's limit on bound parameters is far above)

_OWNER_SQL = (
    "SELECT t.chain_id, json_extract(r.request, '$.conversation.id') "
    "FROM tasks t JOIN responses r ON r.id = t.response_id WHERE t.id = ?"
)


class KvOwnersArea(StoreBase):
    """The owners of KV files: a task's, and which of some are still held."""

    def kv_owner(self, task_id: str) -> str | None:
        """The id of the chain or conversation a task's turn belongs to; None for a task
        in neither (or one deleted since)."""
        with self._db.read() as conn:
            row = conn.execute(_OWNER_SQL, (task_id,)).fetchone()
        if row is None:
            return None
        owner = row[0] or row[1]
        return owner if isinstance(owner, str) and owner else None

    def kv_owners_existing(self, owners: Iterable[str]) -> set[str]:
        """Which of ``owners`` (conversation ids ``conv_...``, the others chain ids) the
        store still holds."""
        wanted = sorted(set(owners))
        found: set[str] = set()
        for i in range(0, len(wanted), CHUNK):
            part = wanted[i : i + CHUNK]
            convs = [o for o in part if o.startswith("conv_")]
            chains = [o for o in part if not o.startswith("conv_")]
            with self._db.read() as conn:
                for table, ids in (("conversations", convs), ("chains", chains)):
                    if ids:
                        marks = ",".join("?" * len(ids))
                        found.update(r[0] for r in conn.execute(f"SELECT id FROM {table} WHERE id IN ({marks})", ids))
        return found
