"""A worker's hold on its tasks: it claims them under a lease, renews the
lease, starts them (``loading``, ``running``), gives up on one (``fail_task``)
and lets them go when it stops (``release``). The output of a running task is
written by :mod:`lmsp.store.steps`."""

from __future__ import annotations

import json
import sqlite3
from typing import Iterable

from lmsp.items.chat import TEXT_DELTA
from ..contracts import ClaimRecord, Resume
from . import states as st
from . import sharing
from .chains import with_context
from .base import TASK_SELECT, UNFINISHED_SQL, StoreBase


def claim_record(conn: sqlite3.Connection, task: dict, response: sqlite3.Row, resume: Resume | None) -> ClaimRecord:
    """What a worker needs to run a task it claimed (``status``: the state it was claimed in;
    ``request``: with the context it continues read back, :func:`.chains.with_context`)."""
    return {
        "task_id": task["id"],
        "response_id": task["response_id"],
        "model": task["model"],
        "request": with_context(conn, json.loads(response["request"])),
        "status": task["status"],
        "on_restart": task["on_restart"],
        "attempts": task["attempts"],
        "item_id": response["item_id"],
        "resume": resume,
        "client_id": task["client_id"],
    }


def _tokens_list(text: str | None) -> list[int]:
    return [int(t) for t in text.split(",")] if text else []


class WorkerArea(StoreBase):
    """Claims, leases, the start of a task, and a worker's giving up."""

    def _owned(self, conn: sqlite3.Connection, task_id: str, owner: str, target: str) -> dict:
        """The task, if ``owner`` holds it and may move it to ``target`` (or it is there already)."""
        task = self._task(conn, task_id)
        if task["status"] != target:
            st.check(task_id, task["status"], target)
        if task["owner"] != owner:
            raise st.ClaimLost(task_id, owner, task["owner"])
        return task

    def claim(self, owner: str, *, limit: int, lease: float) -> list[ClaimRecord]:
        """Atomically take up to ``limit`` claimable tasks (queued, or running to resume) in
        their fair order (:mod:`.sharing`), skipping a client's beyond its ``max_running``."""
        if not owner:
            raise ValueError("owner must be a non-empty string")
        if limit < 1:
            return []
        with self._db.write() as conn:
            now = self._clock()
            claims: list[ClaimRecord] = []
            for task in self._next_to_start(conn, limit):
                # a resumed task's held-back tokens are sampled again (``_resume``): none held now
                conn.execute(
                    "UPDATE tasks SET owner = ?, lease_expires = ?, pending_tokens = '' WHERE id = ?",
                    (owner, now + lease, task["id"]),
                )
                response = self._response_row(conn, task["response_id"])
                resume = self._resume(conn, task) if task["status"] == st.RUNNING else None
                claims.append(claim_record(conn, task, response, resume))
            return claims

    @staticmethod
    def _next_to_start(conn: sqlite3.Connection, limit: int) -> list[dict]:
        """Up to ``limit`` claimable tasks in the order they start, none of a client beyond
        its ``max_running`` (counting those taken here)."""
        out: list[dict] = []
        taking: dict[str | None, int] = {}
        full: set[str | None] = set()
        sql = TASK_SELECT.removesuffix(" FROM tasks") + f" FROM {sharing.QUEUE} ORDER BY {sharing.START_ORDER}"
        for row in conn.execute(sql):
            task = dict(row)
            client = task["client_id"]
            if task["status"] == st.QUEUED:  # a task to resume started already: never held back
                if client in full:
                    continue
                if not sharing.may_start(conn, client, taking.get(client, 0)):
                    full.add(client)
                    continue
            taking[client] = taking.get(client, 0) + 1
            out.append(task)
            if len(out) >= limit:
                break
        return out

    @staticmethod
    def _resume(conn: sqlite3.Connection, task: dict) -> Resume:
        """Where the output of a ``running`` task claimed to continue stands."""
        events = conn.execute(
            "SELECT text, tokens, type, data FROM task_events WHERE task_id = ? AND seq > ?"
            " AND (text IS NOT NULL OR (type = ? AND data IS NOT NULL)) ORDER BY seq",
            (task["id"], task["attempt_seq"], TEXT_DELTA),
        )
        generated: list[int] = []
        emitted = []
        logprobs: list[dict] = []
        for text, tokens, etype, data in events:
            if text is not None:
                generated.extend(_tokens_list(tokens))
                emitted.append(text)
            if etype == TEXT_DELTA and data is not None:  # the text's log probabilities, if any
                logprobs.extend(json.loads(data).get("logprobs") or ())
        # the tokens held back without text (task["pending_tokens"]) are not taken: the
        # engine samples them again, the same by their positions, and gives their text
        # and log probabilities again, which were never committed
        out: Resume = {"generated": generated, "emitted": "".join(emitted), "kv_path": task["kv_path"]}
        if logprobs:
            out["logprobs"] = logprobs
        return out

    def renew(self, owner: str, *, lease: float, task_ids: Iterable[str] | None = None) -> list[str]:
        """Extend the leases of ``owner``'s unfinished tasks (only those in ``task_ids`` when
        given); return those of its tasks now ``cancelling``.

        A worker names the tasks it runs, so that one it holds but does not run
        (lost between its claim and its start) is not kept alive: its lease runs
        out and recovery applies its restart policy.
        """
        with self._db.write() as conn:
            now = self._clock()
            sql = f"UPDATE tasks SET lease_expires = ? WHERE owner = ? AND status IN {UNFINISHED_SQL}"
            if task_ids is None:
                conn.execute(sql, (now + lease, owner))
            else:
                ids = list(task_ids)
                for i in range(0, len(ids), 500):
                    chunk = ids[i : i + 500]
                    conn.execute(f"{sql} AND id IN ({','.join('?' * len(chunk))})", (now + lease, owner, *chunk))
            return [
                r[0] for r in conn.execute("SELECT id FROM tasks WHERE owner = ? AND status = 'cancelling'", (owner,))
            ]

    def set_loading(self, task_id: str, owner: str) -> None:
        """queued → loading (+ ``task.loading``)."""
        with self._db.write() as conn:
            now = self._clock()
            task = self._owned(conn, task_id, owner, st.LOADING)
            if task["status"] == st.LOADING:
                return
            self._move(task, st.LOADING)
            self._emit_task(conn, task, "task.loading", now)
            self._save(conn, task)

    def set_running(self, task_id: str, owner: str) -> None:
        """queued/loading → running (+ ``task.running``, ``response.in_progress``); a resumed task: nothing."""
        with self._db.write() as conn:
            now = self._clock()
            task = self._owned(conn, task_id, owner, st.RUNNING)
            if task["status"] == st.RUNNING:
                return
            self._move(task, st.RUNNING)
            if task["started_at"] is None:
                task["started_at"] = now
            self._emit_task(conn, task, "task.running", now)
            self._emit_response(conn, task, "response.in_progress", now)
            self._save(conn, task)

    def fail_task(self, task_id: str, owner: str, *, code: str, message: str) -> None:
        """The worker gives up on a task (e.g. its model failed to load): failed + ``response.failed``.

        A task already ``cancelling`` ends ``cancelled`` instead (B.7).
        """
        with self._db.write() as conn:
            now = self._clock()
            task = self._task(conn, task_id)
            if task["status"] in st.FINISHED:
                st.check(task_id, task["status"], st.FAILED)
            if task["owner"] != owner:
                raise st.ClaimLost(task_id, owner, task["owner"])
            if task["status"] == st.CANCELLING:
                self._finish(conn, task, st.CANCELLED, now)
                self._emit_response(conn, task, "response.cancelled", now)
            else:
                self._finish(conn, task, st.FAILED, now, error={"code": str(code), "message": str(message)})
                self._emit_response(conn, task, "response.failed", now)
            self._save(conn, task)

    def release(self, owner: str, task_ids: Iterable[str] | None = None) -> None:
        """Graceful shutdown of a worker: claimed-but-unstarted tasks go back to the queue; started
        ones keep their state with an expired lease, so recovery applies their restart policy.
        ``task_ids``: only those (claims a worker that began to drain meanwhile will not start)."""
        only = None if task_ids is None else set(task_ids)
        for tid, state in list(self._step_cache.items()):
            if state.owner == owner and (only is None or tid in only):
                self._step_cache.pop(tid, None)
        which, args = ("", [(owner,)]) if only is None else (" AND id = ?", [(owner, tid) for tid in only])
        with self._db.write() as conn:
            conn.executemany(
                "UPDATE tasks SET owner = NULL, lease_expires = NULL WHERE owner = ? AND status = 'queued'" + which,
                args,
            )
            conn.executemany(
                f"UPDATE tasks SET lease_expires = 0 WHERE owner = ? AND status IN {UNFINISHED_SQL}" + which, args
            )
