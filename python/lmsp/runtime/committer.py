"""The commit thread: engine results into the store, in group commits.

The thread sleeps on the engines' result descriptors, drains ``engine.poll()``,
writes everything it drained in ONE ``store.append_step`` transaction (all
running tasks together), then wakes the requests waiting for those tasks.
Group commit: output keeps gathering for up to ``commit_window_ms`` after the
first uncommitted result, so one transaction (one fsync) carries several
engine steps; a task's first text and its end are committed at once (while a
window gathers, the thread sleeps on the engines' urgent descriptors, which
only a sequence's first text and its end make readable). The rows a commit
wrote for the tasks it left running are kept until the next one, so that this
worker's streams take them from memory (:meth:`Committer.committed_events`)
instead of reading them back.

The same thread renews the leases (acting on cancels made by other processes)
and recovers the tasks of dead workers (leases expired). A store error keeps
the results in memory and retries with backoff; nothing is lost and nothing is
written twice (the items of a failed transaction are merged with the next
results and written together).

:meth:`Committer.commit` is where a subclass may change what a round writes
(the runtime takes the class as its ``committer`` argument).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from ..contracts import EngineResult, StepItem, StepOutcome
from ..objects import event_object
from .logprobs import result_logprobs
from .rpc import BACKEND_LOST
from .state import IDLE_WAIT, MAX_BACKOFF, Run, WorkerState
from lmsp.runtime.calls import add as add_segment

log = logging.getLogger("lmsp.runtime")


def merge(item: StepItem | None, run: Run, result: EngineResult) -> StepItem:
    """Fold one engine result into the pending store item of its task (a new one in
    place of an item of an earlier claim of the task, which the store would refuse)."""
    if item is None or item["attempt"] != run.attempt:
        item = {
            "task_id": run.task_id,
            "attempt": run.attempt,
            "delta": "",
            "tokens": [],
            "finish": None,
            "error": None,
            "usage": None,
            "kv_path": None,
        }
    finish = result.get("finish")
    text = result.get("text") or ""
    logprobs = result_logprobs(run.engine, result) if result.get("logprobs") else []
    take_logprobs = getattr(run.calls, "take_logprobs", None)
    if take_logprobs is not None:  # on the chat layer: its message's text's tokens (runtime.chat_shaper)
        take_logprobs(logprobs)
        logprobs = []
    tokens = list(result.get("tokens") or ())
    if run.calls is None:
        item["delta"] += text
    else:
        shaped = run.calls.push(text, bool(finish))
        if "calls" in shaped:  # function calls'
            segments = item.setdefault("calls", [])
            for segment in shaped["calls"]:
                add_segment(segments, segment)
        else:
            item["delta"] += shaped["delta"]
        if shaped.get("consumed") is False and not finish:  # the chat layer's, its text not taken yet
            item.setdefault("held_tokens", []).extend(tokens)
            tokens = []
        else:
            tokens = item.pop("held_tokens", []) + tokens
    item["tokens"].extend(tokens)
    if logprobs:  # a call's tokens have theirs dropped with its rows (store.steprows)
        item.setdefault("logprobs", []).extend(logprobs)
    if finish:
        item["finish"] = finish
        if finish == "error":
            item["error"] = {
                "code": result.get("code") or "engine_error",
                "message": result.get("error") or "generation failed",
            }
        item["usage"] = {
            "input_tokens": int(result.get("n_prompt") or 0),
            "output_tokens": int(result.get("n_generated") or 0),
            "cached_tokens": int(result.get("n_cached") or 0),
        }
    return item


def ended_result(run: Run, code: str, message: str) -> EngineResult:
    """The last result of a run that the engine will not give (its engine closed)."""
    return {
        "seq": run.seq or 0,
        "tokens": [],
        "text": "",
        "finish": "error",
        "error": message,
        "code": code,
        "n_prompt": 0,
        "n_generated": 0,
        "n_cached": 0,
        "timings": {},
    }


class Committer:
    """The commit thread's room (see the module docstring). ``close_deleted`` runs at
    every lease round: the model room unloads deleted models whose runs have ended."""

    def __init__(self, state: WorkerState, close_deleted: Callable[[], None]) -> None:
        self.state = state
        self.store = state.store
        self.close_deleted = close_deleted
        self.window = float(state.config.commit_window_ms) / 1000.0
        self.pending: dict[str, StepItem] = {}  # task id -> store item not yet committed
        # task id -> (attempt, log probabilities of tokens committed before their text):
        # they go with the next item of the task, which has that text
        self.held_logprobs: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        self.pending_since = 0.0  # when the oldest uncommitted result arrived
        self.urgent = False  # a first text or an end is pending: commit now
        self.next_renew = self.next_recover = 0.0
        # runs whose engine lost an RPC server (with its message): given back after a commit
        self.lost: list[tuple[Run, str]] = []

    # ---------------------------------------------------------------- the thread
    def run(self) -> None:
        """The thread's loop, until the runtime stops (after a last commit) or aborts."""
        now = time.monotonic()
        self.next_renew = now + self.state.lease / 3
        self.next_recover = now + self.state.lease / 2
        backoff = 0.0
        while not self.state.aborted:
            try:
                backoff, done = self.round(backoff)
            except Exception:  # a bug must not silently stop every task of this worker
                log.exception("commit loop error")
                backoff, done = MAX_BACKOFF, False
            if done:
                break

    def round(self, backoff: float) -> tuple[float, bool]:
        """One wait-drain-commit round, then the lease housekeeping; (next backoff, finished)."""
        state = self.state
        self.sleep(backoff)
        engines = state.registry.engines()
        stopping = state.stopping
        if state.aborted:
            return 0.0, True
        self.drain(engines)
        due = self.urgent or stopping or backoff or self.lost or time.monotonic() >= self.pending_since + self.window
        if self.pending and due and not self.commit():
            backoff = min(MAX_BACKOFF, (backoff or 0.05) * 2)
            if stopping and backoff >= MAX_BACKOFF:
                log.error("giving up on %d uncommitted results at shutdown", len(self.pending))
                return backoff, True
            return backoff, False
        if self.lost:
            self.give_back()
        if stopping:
            return 0.0, True
        self.housekeeping()
        return 0.0, False

    def sleep(self, backoff: float) -> None:
        """Until results come (or a retry is due). While a window gathers, only a first
        text or an end cuts it short, so the engines do not wake the thread for every token."""
        if backoff:
            self.state.commit_wake.wait(backoff)
            return
        gathering = bool(self.pending)
        wait = IDLE_WAIT
        if gathering:
            wait = max(0.0, self.pending_since + self.window - time.monotonic())
        self.state.commit_wake.wait(wait, self.engine_fds(urgent=gathering))

    def housekeeping(self) -> None:
        """The lease rounds: renew this worker's leases, end orphaned runs, unload
        deleted models, recover the tasks of dead workers."""
        now = time.monotonic()
        if self.state.orphans_due:
            self.state.orphans_due = False
            self.end_orphans()
        if now >= self.next_renew:
            self.next_renew = now + self.state.lease / 3
            self.renew()
            self.end_orphans()
            self.close_deleted()
        if now >= self.next_recover:
            self.next_recover = now + self.state.lease / 2
            self.recover_dead()

    def engine_fds(self, *, urgent: bool) -> list[int]:
        """The descriptors the thread waits on. Only their numbers: no engine is held
        while it waits, so one unloaded meanwhile goes (and frees its memory) at once;
        the descriptors of one gone only wake the wait."""
        fds = []
        for _, engine in self.state.registry.engines():
            try:
                fds.append(engine.urgent_fileno() if urgent else engine.fileno())
            except Exception:  # closed meanwhile
                pass
        return fds

    # ---------------------------------------------------------------- results
    def drain(self, engines: list[tuple[str, Any]]) -> None:
        """Take the results of adopted early runs, then every engine's new results."""
        state = self.state
        if state.released:
            now = time.monotonic()
            with state.lock:
                released, state.released = state.released, []
                for early in released:  # adopted: what they produced meanwhile goes first
                    held, early.held = early.held or [], None
                    for result in held:
                        self.take(early, result, now)
        for _, engine in engines:
            try:
                results = engine.poll()
            except Exception:  # closed by an unload: nothing more will come
                continue
            if not results:
                continue
            now = time.monotonic()
            with state.lock:
                for result in results:
                    run = state.by_seq.get((id(engine), result.get("seq")))
                    if run is None:
                        continue  # a sequence we gave up (claim lost)
                    if run.held is not None:
                        run.held.append(result)  # its task is not committed yet
                        continue
                    self.take(run, result, now)

    def take(self, run: Run, result: EngineResult, now: float) -> None:
        """One engine result into the pending items (under the lock). The end of a run
        whose engine lost an RPC server is not the task's: :meth:`give_back` decides it."""
        if result.get("finish") == "error" and result.get("code") == BACKEND_LOST:
            self.lost.append((run, str(result.get("error") or "an RPC server was lost")))
            return
        if not self.pending:
            self.pending_since = now
        item = self.pending[run.task_id] = merge(self.pending.get(run.task_id), run, result)
        made = getattr(run.calls, "made", None)
        if made is not None:  # an output on the chat layer: its events (runtime.chat_shaper)
            item.setdefault("rows", []).extend(made())
            item["mark"] = run.calls.mark
        held = self.held_logprobs.pop(run.task_id, None)
        if held is not None and held[0] == run.attempt:
            item["logprobs"] = held[1] + item.get("logprobs", [])
        if not run.first_token and result.get("tokens"):
            run.first_token = True
            self.state.stats.first_token(now - run.claimed_at)
        if not run.first_text and result.get("text"):
            # the first text a client will see is not to wait for the window (a first
            # token may show none yet: part of a UTF-8 character, a possible stop string)
            run.first_text = True
            self.urgent = True
        if result.get("finish"):
            run.final = result
            self.urgent = True
            self.state.kvdisk.finished(run.engine, result, run.task_id)

    # ---------------------------------------------------------------- commits
    def commit(self) -> bool:
        """Write every pending item in one transaction; False when the store refused it."""
        return self.write(list(self.pending.values()))

    def write(self, items: list[StepItem], written: list[StepItem] | None = None) -> bool:
        """Commit ``items`` (the store gets ``written``, by default the same), take them
        out of the pending ones, end the runs they end and wake their waiters; False
        (everything kept) when the store refused the transaction."""
        started = time.perf_counter()
        try:
            outcome = (
                self.store.append_step(self.state.owner, items if written is None else written, with_events=True) or {}
            )
        except Exception as exc:
            self.state.stats.commit_failed()
            log.warning("committing %d task(s) failed, kept in memory: %s", len(items), exc)
            return False
        self.state.stats.commit(time.perf_counter() - started, sum(len(item["tokens"]) for item in items))
        committed = outcome.get("events")
        if committed:
            self.state.committed.update(committed)
        self.urgent = False
        for item in items:  # tokens without text yet: their log probabilities wait for it
            if item.get("logprobs") and not item["delta"] and not item["finish"] and "calls" not in item:
                self.held_logprobs[item["task_id"]] = (item["attempt"], item["logprobs"])
        if len(items) == len(self.pending):
            self.pending = {}
        else:
            for item in items:
                del self.pending[item["task_id"]]
        self.settle(items, outcome)
        return True

    def settle(self, items: list[StepItem], outcome: StepOutcome | dict[str, Any]) -> None:
        """After a commit: the runs it ended (or the store skipped) leave the tables,
        and everyone waiting on its tasks wakes."""
        state = self.state
        done = [item["task_id"] for item in items if item["finish"]]
        skipped = list(outcome.get("skipped") or ())
        attempts = {item["task_id"]: item["attempt"] for item in items}
        with state.lock:
            ended = [self._pop_run(task_id, attempts[task_id]) for task_id in done + skipped]
            for run in ended:
                if run is not None and run.seq is not None:
                    state.by_seq.pop(run.key(), None)
        for task_id in done + skipped:
            state.committed.pop(task_id, None)
            self.held_logprobs.pop(task_id, None)
        for run in ended:
            if run is None:
                continue
            if run.task_id in skipped and run.final is None:
                run.cancel_sequence()  # no longer ours: stop spending the slot on it
            elif run.final is not None:
                final = run.final
                state.stats.finish(
                    final.get("finish") or "error", final.get("n_prompt"), final.get("n_cached"), final.get("timings")
                )
        state.waiters.notify([item["task_id"] for item in items])
        if ended:
            state.wake_scheduler()

    def _pop_run(self, task_id: str, attempt: int) -> Run | None:
        """The run of ``task_id`` out of the runs (under the lock), unless the task was
        claimed again since ``attempt``: that run is not the one its items ended."""
        run = self.state.runs.get(task_id)
        if run is None or run.attempt != attempt:
            return None
        return self.state.runs.pop(task_id)

    def committed_events(self, task_id: str, after: int) -> list[dict[str, Any]] | None:
        """The task's events after ``after`` from the latest commit this worker made
        for it, when that commit wrote every one of them; None when it did not (or
        when there is nothing new): then the store has them."""
        entry = self.state.committed.get(task_id)
        if entry is None:
            return None
        item_id, rows = entry
        first = rows[0][0]
        if not first <= after + 1 <= rows[-1][0]:
            return None
        keys = self.store.EVENT_ROW
        return [event_object(dict(zip(keys, row)), item_id) for row in rows[after + 1 - first :]]

    def give_back(self) -> None:
        """After the commit of what they made: the engines that lost an RPC server close
        (their models show ``unavailable`` and load again once it answers), and the tasks
        of every run on them follow their ``on_restart`` as after a worker's crash, counted
        against ``max_attempts``: ``fail`` fails with ``backend_lost``, ``retry`` and
        ``resume`` wait for the model. A store that refuses it is asked again next round."""
        state = self.state
        lost, self.lost = self.lost, []
        engines = {id(run.engine): (run.model, run.engine, message) for run, message in lost}
        with state.lock:  # runs on those engines with no result yet go too
            taken = {run.task_id for run, _ in lost}
            for run in state.runs.values():
                if id(run.engine) in engines and run.final is None and run.task_id not in taken:
                    lost.append((run, engines[id(run.engine)][2]))
        for model, engine, message in engines.values():
            state.registry.lose(model, engine, message)
        by_message: dict[str, list[str]] = {}
        for run, message in lost:
            by_message.setdefault(message, []).append(run.task_id)
        try:
            for message, task_ids in by_message.items():
                self.store.give_back(
                    state.owner, task_ids, code=BACKEND_LOST, message=message, max_attempts=state.config.max_attempts
                )
        except Exception as exc:
            log.warning("giving back %d task(s) of a lost RPC server failed (retried): %s", len(lost), exc)
            self.lost = lost + self.lost
            return
        with state.lock:
            for run, _ in lost:
                if state.runs.get(run.task_id) is run:
                    state.runs.pop(run.task_id)
                if run.seq is not None and state.by_seq.get(run.key()) is run:
                    state.by_seq.pop(run.key())
        state.waiters.notify([run.task_id for run, _ in lost])
        state.wake_scheduler()

    # ---------------------------------------------------------------- leases
    def renew(self) -> None:
        """Extend the leases of the tasks running here; stop those another process cancelled."""
        state = self.state
        with state.lock:
            running = [*state.runs, *state.held]
        if not running:
            return  # nothing claimed: no lease to extend
        try:
            cancelling = self.store.renew(state.owner, lease=state.lease, task_ids=running)
        except Exception as exc:
            log.warning("renewing leases failed: %s", exc)
            return
        for task_id in cancelling or ():
            with state.lock:
                run = state.runs.get(task_id)
                if run is not None:
                    run.cancel = True
            if run is not None:
                run.cancel_sequence()

    def end_orphans(self) -> None:
        """End with an error the runs whose engine closed under them (nothing polls
        a closed engine): otherwise their leases would be renewed for ever. An
        unload waits for a model's tasks, so this is a safety net."""
        state = self.state
        with state.lock:
            orphans = [
                run
                for run in state.runs.values()
                if run.engine is not None
                and run.final is None
                and run.held is None
                and getattr(run.engine, "closed", False)
            ]
            now = time.monotonic()
            for run in orphans:
                code, message = run.failure or ("engine_error", "the model was unloaded while the task ran")
                log.error("task %s: its engine closed while it ran (%s)", run.task_id, code)
                self.take(run, ended_result(run, code, message), now)

    def recover_dead(self) -> None:
        """Recover the tasks of workers whose leases ran out (never this worker's own),
        each within the starts ``max_attempts`` allows."""
        try:
            # this worker's own tasks are alive, whatever their lease says (a wall
            # clock stepped forward, renewals refused by a busy store)
            report = self.store.recover(
                startup=False, exclude_owner=self.state.owner, max_attempts=self.state.config.max_attempts
            )
        except Exception as exc:
            log.warning("recovering expired leases failed: %s", exc)
            return
        moved = [t for key in ("failed", "requeued", "resumed", "cancelled") for t in (report or {}).get(key, ())]
        if moved:
            log.warning("recovered %d task(s) of a dead worker: %s", len(moved), report)
            self.state.waiters.notify(moved)
            self.state.wake_scheduler()
