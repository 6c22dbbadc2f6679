"""What owns a KV file (:mod:`lmsp.kv`): the conversation or the chain of
responses whose turn wrote it. A task's file is tagged with its chain's id
(``tasks.chain_id``), for a response created with a conversation that
conversation's id, else with its response's own id: a chain is named after the
first response continued (:mod:`.chains`), so a stored response that no other
continues yet owns its file under the name its chain will have. A file whose
owner the store no longer holds (a conversation, a chain, or a response in no
chain) is deleted by the janitor's next round and by ``lmsp gc``."""

from __future__ import annotations

from typing import Iterable

from lmsp.store.base import StoreBase

CHUNK = 500  # ids a query names at most (SQLite's limit on bound parameters is far above)

_OWNER_SQL = (
    "SELECT t.chain_id, json_extract(r.request, '$.conversation.id'), r.id "
    "FROM tasks t JOIN responses r ON r.id = t.response_id WHERE t.id = ?"
)


class KvOwnersArea(StoreBase):
    """The owners of KV files: a task's, and which of some are still held."""

    def kv_owner(self, task_id: str) -> str | None:
        """The id of the chain or conversation a task's turn belongs to, else its response's
        own id (the chain it would start); None for a task deleted since."""
        with self._db.read() as conn:
            row = conn.execute(_OWNER_SQL, (task_id,)).fetchone()
        if row is None:
            return None
        owner = row[0] or row[1] or row[2]
        return owner if isinstance(owner, str) and owner else None

    def kv_owners_existing(self, owners: Iterable[str]) -> set[str]:
        """Which of ``owners`` (conversation ids ``conv_...``, the others ids of chains or
        of responses) the store still holds."""
        wanted = sorted(set(owners))
        found: set[str] = set()
        for i in range(0, len(wanted), CHUNK):
            part = wanted[i : i + CHUNK]
            convs = [o for o in part if o.startswith("conv_")]
            chains = [o for o in part if not o.startswith("conv_")]
            with self._db.read() as conn:
                for table, ids in (("conversations", convs), ("chains", chains), ("responses", chains)):
                    if ids:
                        marks = ",".join("?" * len(ids))
                        found.update(r[0] for r in conn.execute(f"SELECT id FROM {table} WHERE id IN ({marks})", ids))
        return found

    def kv_lone_responses(self, owners: Iterable[str]) -> set[str]:
        """Which of ``owners`` are responses that head no chain (none continues them)."""
        wanted = sorted(o for o in set(owners) if not o.startswith("conv_"))
        lone: set[str] = set()
        for i in range(0, len(wanted), CHUNK):
            part = wanted[i : i + CHUNK]
            marks = ",".join("?" * len(part))
            with self._db.read() as conn:
                kept = {r[0] for r in conn.execute(f"SELECT id FROM chains WHERE id IN ({marks})", part)}
                lone.update(
                    r[0]
                    for r in conn.execute(f"SELECT id FROM responses WHERE id IN ({marks})", part)
                    if r[0] not in kept
                )
        return lone
