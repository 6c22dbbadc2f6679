"""The life of a response request: its response and queued task created in one
transaction (with its idempotency key, and claimed at once by a worker that
can run it), its cancel (B.7), and its deletion once finished."""

from __future__ import annotations

import json
import sqlite3

from .. import objects as obj
from ..contracts import ClaimRecord, CreatedTask, StepState
from ..errors import InvalidRequest, LMSPError, NotFound, RateLimited, TaskFinished, TaskUnfinished
from . import chains, sharing
from . import states as st
from .base import CLAIMABLE_SQL, TASK_SELECT, UNFINISHED_SQL, dumps
from .idempotency import IdempotencyArea, answer_keys
from .items import insert_response_items
from .turns import take
from .worker import claim_record

#: the id prefix of a task's response by its kind (LMSP B.1, B.11)
ID_PREFIXES = {"response": "resp_", "chat.completion": "chatcmpl-", "text_completion": "cmpl-", "embedding": "embd-"}
# tasks that the worker which makes them runs at once: always claimed by it at creation
HELD_KINDS = ("embedding",)


class TasksArea(IdempotencyArea):
    """Creating, cancelling and deleting responses and their tasks (a request's
    idempotency key is decided in the transaction that creates its task)."""

    def create_task(
        self,
        *,
        client_id: str | None,
        model: str,
        request: dict,
        on_restart: str,
        background: bool,
        stream: bool,
        idempotency: tuple[str, str] | None = None,
        claim: tuple[str, float] | None = None,
        max_unfinished: int | None = None,
        kind: str = "response",
        items: list[dict] | None = None,
        conversation: tuple[str, int] | None = None,
    ) -> CreatedTask:
        """Persist a new response and its queued task in ONE transaction (11.2, B.8).

        ``max_unfinished``: RateLimited when the client already has that many
        unfinished tasks (counted in the same transaction, so concurrent
        requests cannot all pass it); a replay is never refused. ``items`` and
        ``conversation``: see :meth:`_keep_context`.

        ``claim=(owner, lease)``: a worker with a free engine slot and the model
        loaded takes the new task in the same transaction and moves it to
        ``running`` (``task.running``, ``response.in_progress``), unless older
        tasks wait to be claimed (they go first).

        Returns ``{"response", "task", "replay", "claim"}``; ``replay`` is None
        for a new task, else ``(status_code, body)`` to send again (nothing was
        created); ``claim`` is what :meth:`claim` returns for one task when the
        new task was claimed, else None; ``response``: as created (``queued``). ``kind``
        names the response's id (:data:`ID_PREFIXES`); one of :data:`HELD_KINDS` is always claimed.
        """
        request_text, turn = self._request_text(model, request, on_restart, kind, claim)
        with self._db.write() as conn:
            now = self._clock()
            if idempotency is not None:
                replay = self._replay(conn, client_id, idempotency, now)
                if replay is not None:
                    return replay
            self._check_client(conn, client_id, max_unfinished, now)
            task, response = self._insert_task(
                conn, client_id, model, request_text, on_restart, background, stream, now, kind
            )
            self._keep_context(conn, response["id"], task["id"], client_id, items, conversation)
            if turn is not None:  # it continues a response: it joins that one's chain
                chains.link(conn, task["id"], turn, now)
            body = self._render_response(conn, response, task)
            first = kind not in HELD_KINDS  # else claimed whatever waits
            taken = None if claim is None else self._claim_new(conn, task, response, claim, now, after_older=first)
            self._save(conn, task)
            if idempotency is not None:
                self._remember_task_key(conn, client_id, idempotency, task["id"], body if background else None, now)
            claimed = None if taken is None else taken[0]
            shown = self._task_object(conn, task)
            out: CreatedTask = {"response": body, "task": shown, "replay": None, "claim": claimed}
        if taken is not None:  # committed
            self._step_cache[task["id"]] = taken[1]
        return out

    @staticmethod
    def _keep_context(
        conn: sqlite3.Connection,
        response_id: str,
        task_id: str,
        client_id: str | None,
        items: list[dict] | None,
        conversation: tuple[str, int] | None,
    ) -> None:
        """A new response's input items (``items``, as listed), and its task's hold on the
        conversation it continues (``conversation``: ``(id, version)``, :func:`.turns.take`)."""
        if items:
            insert_response_items(conn, response_id, items)
        if conversation is not None:
            take(conn, conversation, client_id, task_id)

    @staticmethod
    def _request_text(
        model: str, request: dict, on_restart: str, kind: str, claim: tuple | None
    ) -> tuple[str, dict | None]:
        """The request as stored, once its model and restart policy are checked, and the
        turn of the response it continues (:func:`.chains.stored_request`)."""
        if kind in HELD_KINDS and claim is None:
            raise ValueError(f"a task of kind {kind} is created claimed by the worker that runs it")
        if on_restart not in st.POLICIES:
            raise InvalidRequest(f"on_restart must be one of {', '.join(st.POLICIES)}", param="on_restart")
        if not isinstance(request, dict):
            raise InvalidRequest("the request must be a JSON object")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("model is required", param="model")
        request, turn = chains.stored_request(request)
        try:
            return dumps(request), turn
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(f"the request is not JSON: {exc}") from exc

    @staticmethod
    def _check_client(conn: sqlite3.Connection, client_id: str | None, max_unfinished: int | None, now: float) -> None:
        """The service's cap on a client's unfinished tasks, then the client's own limits
        (:func:`.sharing.check_limits`)."""
        sharing.check_limits(conn, client_id, now)
        if max_unfinished is None or client_id is None:
            return
        n = conn.execute(
            f"SELECT count(*) FROM tasks WHERE client_id = ? AND status IN {UNFINISHED_SQL}", (client_id,)
        ).fetchone()[0]
        if n >= max_unfinished:
            raise RateLimited(
                f"this client has {n} unfinished tasks, the most it may have "
                "(max_unfinished_per_client); wait for some to finish",
                retry_after=1,
            )

    def _insert_task(
        self,
        conn: sqlite3.Connection,
        client_id: str | None,
        model: str,
        request_text: str,
        on_restart: str,
        background: bool,
        stream: bool,
        now: float,
        kind: str = "response",
    ) -> tuple[dict, sqlite3.Row]:
        """A new response and its queued task, with their first two events."""
        if kind not in ID_PREFIXES:
            raise InvalidRequest(f"unknown kind of task {kind!r}")
        prefix = ID_PREFIXES[kind]
        rid = prefix + self._new_id(prefix[:-1]).split("_", 1)[1]
        tid, mid = self._new_id("task"), self._new_id("msg")
        conn.execute(
            "INSERT INTO responses (id, client_id, model, created_at, request, background, stream,"
            " item_id) VALUES (?,?,?,?,?,?,?,?)",
            (rid, client_id, model, now, request_text, int(bool(background)), int(bool(stream)), mid),
        )
        conn.execute(
            "INSERT INTO tasks (id, response_id, client_id, model, status, on_restart, created_at, start_tag)"
            " VALUES (?,?,?,?,'queued',?,?,?)",
            (tid, rid, client_id, model, on_restart, now, sharing.start_tag(conn, client_id)),
        )
        task = self._task(conn, tid)
        response = self._response_row(conn, rid)
        self._emit_response(conn, task, "response.created", now, response)
        self._emit_response(conn, task, "response.queued", now, response)
        return task, response

    def _claim_new(
        self,
        conn: sqlite3.Connection,
        task: dict,
        response: sqlite3.Row,
        claim: tuple[str, float],
        now: float,
        *,
        after_older: bool = True,
    ) -> tuple[ClaimRecord, StepState] | None:
        """``claim=(owner, lease)`` takes the new task and starts it, unless other tasks wait
        to be claimed (``after_older``: they start in their order, :mod:`.sharing`) or its
        client runs as many as it may; returns its claim and the step state it leaves
        (its first step then needs no read), or None."""
        if after_older and (
            conn.execute(f"SELECT 1 FROM tasks WHERE {CLAIMABLE_SQL} AND id != ? LIMIT 1", (task["id"],)).fetchone()
            is not None
            or not sharing.may_start(conn, task["client_id"])
        ):
            return None
        owner, lease = claim
        claimed = claim_record(conn, task, response, None)
        self._move(task, st.RUNNING)
        task.update(owner=owner, lease_expires=now + lease, started_at=now)
        self._emit_task(conn, task, "task.running", now)
        self._emit_response(conn, task, "response.in_progress", now, response)
        return claimed, StepState(owner, task["last_seq"], 0, "", None, response["item_id"])

    def _resolve(self, conn: sqlite3.Connection, task_or_response_id: str, client_id: str | None) -> dict:
        if str(task_or_response_id).startswith(tuple(ID_PREFIXES.values())):
            row = conn.execute(
                "SELECT id, client_id FROM tasks WHERE response_id = ?", (task_or_response_id,)
            ).fetchone()
            if row is None or (client_id is not None and row[1] != client_id):  # another's: unknown alike
                raise NotFound(f"no response {task_or_response_id}")
            return self._task(conn, row[0], client_id)
        return self._task(conn, task_or_response_id, client_id)

    def cancel(self, task_or_response_id: str, client_id: str | None = None) -> dict:
        """B.7 in one transaction; returns the Task object."""
        with self._db.write() as conn:
            now = self._clock()
            task = self._resolve(conn, task_or_response_id, client_id)
            status = task["status"]
            if status in (st.COMPLETED, st.FAILED):
                raise TaskFinished(f"task {task['id']} is already {status}")
            if status in (st.QUEUED, st.LOADING) or (status == st.RUNNING and task["owner"] is None):
                # nobody is generating for it (a resumable task waits unowned): cancelled at once
                self._finish(conn, task, st.CANCELLED, now)
                self._emit_response(conn, task, "response.cancelled", now)
                self._save(conn, task)
            elif status == st.RUNNING:
                self._move(task, st.CANCELLING)
                self._emit_task(conn, task, "task.cancelling", now)
                self._save(conn, task)
            return obj.task_object(task)

    def update_metadata(self, response_id: str, metadata: dict[str, str], client_id: str | None = None) -> None:
        """Replace the ``metadata`` of a response's request (what its object shows and its
        list filters on); the rest of the request is left as it was."""
        with self._db.write() as conn:
            request = json.loads(self._response_row(conn, response_id, client_id)["request"])
            request["metadata"] = dict(metadata)
            conn.execute("UPDATE responses SET request = ? WHERE id = ?", (dumps(request), response_id))

    def delete_response(self, response_id: str, client_id: str | None = None, *, keep_for_key: bool = False) -> dict:
        """Delete a finished response with its task and events. An idempotency key of
        its request answers a retry with 404 from now on; with ``keep_for_key`` (a
        ``store: false`` response deleted once delivered, whose client may not have
        received it) with the final Response object, until the key expires."""
        with self._db.write() as conn:
            self._delete_response(conn, response_id, client_id, keep_for_key)
        return obj.deleted_response(response_id)

    def forget_responses(self, given: list[tuple[str, str | None]]) -> list[LMSPError | None]:
        """Delete delivered ``store: false`` responses (``(response_id, client_id)``
        each, as :meth:`delete_response` with ``keep_for_key``) in one transaction;
        for each, None or the error that left it in place (not found, unfinished)."""
        out: list[LMSPError | None] = []
        with self._db.write() as conn:
            for response_id, client_id in given:
                try:
                    self._delete_response(conn, response_id, client_id, keep_for_key=True)
                    out.append(None)
                except (NotFound, TaskUnfinished) as exc:  # raised before it wrote anything
                    out.append(exc)
        return out

    def _delete_response(
        self, conn: sqlite3.Connection, response_id: str, client_id: str | None, keep_for_key: bool
    ) -> None:
        response = self._response_row(conn, response_id, client_id)
        task = conn.execute("SELECT id, status, chain_id FROM tasks WHERE response_id = ?", (response_id,)).fetchone()
        if task is not None and task["status"] in st.UNFINISHED:
            raise TaskUnfinished(f"response {response_id} is still {task['status']}; cancel it first")
        keyed = task is not None and (
            conn.execute("SELECT 1 FROM idempotency_keys WHERE task_id = ? LIMIT 1", (task["id"],)).fetchone()
            is not None
        )
        if keyed:  # the final object is rendered only for a key that keeps it
            final = None
            if keep_for_key:
                full = dict(conn.execute(TASK_SELECT + " WHERE id = ?", (task["id"],)).fetchone())
                final = self._render_response(conn, response, full)
            answer_keys(conn, task["id"], final)
        conn.execute("DELETE FROM responses WHERE id = ?", (response_id,))  # cascades to task and events
        chains.drop_if_empty(conn, None if task is None else task["chain_id"])
