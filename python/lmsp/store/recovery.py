"""Recovery (LMSP 11.3, B.12): the tasks left unfinished by a stopped service, or by
a worker whose lease ran out, are failed, requeued, resumed or cancelled as
their ``on_restart`` policy and the state they were found in say.

A task found started (``loading`` or ``running``, held by a worker) whose
worker stopped has used one of its ``max_attempts`` starts: its ``attempts``
goes up by one when it is restarted. A restart that would take ``attempts``
past ``max_attempts`` fails the task with ``attempts_exhausted`` instead,
whatever its policy: a task that kills its worker every time is not restarted
for ever. A task found waiting (``queued``, or ``running`` and held by nobody: a resume
that no worker took yet) was not started, and keeps its count."""

from __future__ import annotations

import sqlite3

from . import states as st
from .base import UNFINISHED_SQL, StoreBase

#: the starts a task has by default (the service's ``max_attempts`` setting)
DEFAULT_MAX_ATTEMPTS = 3
EXHAUSTED = "attempts_exhausted"


def was_started(task: dict) -> bool:
    """The task was held by a worker that had started it (``loading`` or ``running``)."""
    return task["status"] in (st.LOADING, st.RUNNING) and task["owner"] is not None


def empty_report() -> dict[str, list]:
    """What :meth:`RecoveryArea.recover` and :meth:`RecoveryArea.give_back` report, before
    any task."""
    return {k: [] for k in ("failed", "requeued", "resumed", "cancelled", "exhausted", "kv_paths")}


class RecoveryArea(StoreBase):
    """The 11.3 table applied to leftover tasks, within their ``max_attempts``."""

    def recover(
        self,
        *,
        startup: bool = True,
        now: float | None = None,
        batch: int = 100,
        exclude_owner: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> dict:
        """Apply the 11.3 table to leftover tasks and report what was done.

        ``startup=True``: every queued/loading/running/cancelling task (run it
        once, before any worker claims). ``startup=False``: only tasks whose
        owner's lease expired (a worker died), other than ``exclude_owner``'s
        (the caller's own, which it knows to be alive). ``max_attempts``: the
        starts a task may have (B.12). Returns ``{"failed", "requeued",
        "resumed", "cancelled": [task ids], "exhausted": [the failed ones that
        had no start left], "kv_paths": [snapshot files no longer needed]}``.
        """
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        report = empty_report()
        when = self._clock() if now is None else now
        where = f"status IN {UNFINISHED_SQL}"
        args: tuple = ()
        if not startup:
            where += " AND owner IS NOT NULL AND lease_expires < ?"
            args = (float(when),)
            if exclude_owner is not None:
                where += " AND owner != ?"
                args += (exclude_owner,)
        sql = f"SELECT id FROM tasks WHERE {where} AND id > ? ORDER BY id LIMIT ?"
        last = ""
        while True:
            with self._db.write() as conn:
                ids = [r[0] for r in conn.execute(sql, (*args, last, batch))]
                if not ids:
                    break
                last = ids[-1]
                stamp = self._clock()
                for tid in ids:
                    task = self._task(conn, tid)
                    if task["status"] not in st.UNFINISHED:
                        continue
                    if not startup and not (
                        task["owner"] is not None and task["lease_expires"] < when and task["owner"] != exclude_owner
                    ):
                        continue
                    self._recover_one(conn, task, stamp, report, max_attempts)
        return report

    def give_back(self, owner: str, task_ids: list[str], *, code: str, message: str, max_attempts: int) -> dict:
        """``owner``'s own started tasks whose run ended through no fault of theirs (an RPC
        server lost mid-generation, the worker alive): each follows its ``on_restart`` as
        recovery applies it, counted against ``max_attempts``; a ``fail`` one fails with
        ``code`` and ``message``. Tasks finished or no longer ``owner``'s are left alone.
        Returns the report :meth:`recover` gives."""
        report = empty_report()
        for tid in task_ids:
            self._step_cache.pop(tid, None)
        error = {"code": code, "message": message}
        with self._db.write() as conn:
            now = self._clock()
            for tid in task_ids:
                task = self._task(conn, tid)
                if task["status"] in st.UNFINISHED and task["owner"] == owner:
                    self._recover_one(conn, task, now, report, max_attempts, error)
        return report

    def _recover_one(
        self,
        conn: sqlite3.Connection,
        task: dict,
        now: float,
        report: dict,
        max_attempts: int,
        error: dict | None = None,
    ) -> None:
        found = task["status"]
        target = st.RECOVERY[(found, task["on_restart"])]
        started = was_started(task)
        exhausted = started and task["attempts"] >= max_attempts
        if exhausted:
            target = st.FAILED
        if task["kv_path"] and target != st.RUNNING:
            report["kv_paths"].append(task["kv_path"])
        if target == st.FAILED:
            if exhausted:
                failure = {
                    "code": EXHAUSTED,
                    "message": f"the task's worker stopped during each of its {task['attempts']} starts; "
                    f"max_attempts ({max_attempts}) allows no more",
                }
                report["exhausted"].append(task["id"])
            else:
                failure = error or {
                    "code": "server_restarted",
                    "message": f"the service restarted while the task was {found}",
                }
            self._finish(conn, task, st.FAILED, now, error=failure)
            self._emit_response(conn, task, "response.failed", now)
            report["failed"].append(task["id"])
        elif target == st.CANCELLED:
            self._finish(conn, task, st.CANCELLED, now)
            self._emit_response(conn, task, "response.cancelled", now)
            report["cancelled"].append(task["id"])
        elif target == st.QUEUED:
            self._move(task, st.QUEUED)
            task.update(
                owner=None,
                lease_expires=None,
                item_open=0,
                pending_tokens="",
                kv_path=None,
                attempts=task["attempts"] + int(started),
                started_at=None,
            )
            task["attempt_seq"] = task["last_seq"] + 1  # the output restarts after task.requeued
            self._emit_task(conn, task, "task.requeued", now)
            report["requeued"].append(task["id"])
        else:  # running, continuing from the snapshot
            self._move(task, st.RUNNING)
            task.update(owner=None, lease_expires=None, attempts=task["attempts"] + int(started))
            self._emit_task(conn, task, "task.resumed", now)
            report["resumed"].append(task["id"])
        self._save(conn, task)
