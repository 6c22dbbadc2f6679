"""The scheduler thread: claimed tasks onto the engines.

It starts the tasks adopted at their creation (:mod:`.admission`), claims queued
tasks up to the free engine slots, loads the model when needed (task
``loading``), renders the prompt and submits it to the engine (task
``running``), resuming recovered tasks from their snapshot.

A claimed task ends up submitted, failed in the store, or dropped because the
store says it is no longer this worker's. A start the store cannot write (a
full disk, a database locked past its busy timeout) is tried again with backoff
for as long as the store refuses it; other errors of a start are tried
``START_TRIES`` times before the task fails with ``internal_error``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from ..contracts import ClaimRecord
from ..errors import IllegalTransition, LMSPError, NotFound, Unavailable
from lmsp.runtime import chat_layer
from lmsp.runtime import kv
from . import prompt as prompting
from .state import IDLE_WAIT, MAX_BACKOFF, Run, WorkerState
from lmsp.runtime.calls import CallShaper

if TYPE_CHECKING:
    from ..native import Engine

log = logging.getLogger("lmsp.runtime")

SERVER_WAIT = 3.0  # seconds between two loads of a model waiting for a lost RPC server
START_TRIES = 5  # transient errors a claimed task may meet before it fails (a store
# that cannot be written is not one: the task waits for it)
STORE_WAIT_LOG_EVERY = 30  # a task waiting for the store is logged on its first try and every 30th


class EngineGone(Exception):
    """The engine a task was about to start on left the registry: the start is tried again."""


class ServerWait(Exception):
    """The task's model lost an RPC server and it does not answer yet: the task keeps its
    claim (``loading``) and the load is tried again every ``SERVER_WAIT`` seconds."""


class Scheduler:
    """The scheduler thread's room (see the module docstring). ``retire_changed(model_id)``
    unloads a model whose file changed (the model room's)."""

    def __init__(self, state: WorkerState, retire_changed: Callable[[str], bool]) -> None:
        self.state = state
        self.store = state.store
        self.retire_changed = retire_changed
        self.retry: list[tuple[Run, ClaimRecord]] = []  # claims to start again (this thread only)
        self.next_reload = 0.0  # when the models that lost an RPC server are tried again

    def run(self) -> None:
        """The thread's loop: a round when woken (a task queued, a slot free) or idle."""
        state = self.state
        backoff = 0.0
        while not state.stopping:
            if not state.sched_wake.wait(backoff or IDLE_WAIT):
                state.claim_due = True  # idle: look for tasks queued by other workers or recovered
            if state.stopping:
                break
            try:
                self.claim_some()
                backoff = 0.0
            except Exception as exc:  # a busy store: try again soon
                state.claim_due = True
                backoff = min(MAX_BACKOFF, (backoff or 0.05) * 2)
                log.warning("claiming tasks failed (retry in %.2f s): %s", backoff, exc)

    def claim_some(self) -> None:
        """One round: the adopted tasks, the retries that are due, then claims up to the free slots."""
        state = self.state
        with state.lock:
            adopted, state.adopted = state.adopted, []
        for run, claim in adopted:
            self.advance(run, claim)
        now = time.monotonic()
        if now >= self.next_reload:
            self.next_reload = now + SERVER_WAIT
            self.reload_lost()
        due = [entry for entry in self.retry if entry[0].retry_at <= now]
        self.retry = [entry for entry in self.retry if entry[0].retry_at > now]
        for run, claim in due:
            if state.stopping:
                return  # still claimed: release() in stop() hands them back
            self.advance(run, claim)
        if not state.claim_due or state.draining:
            return  # woken for tasks adopted at creation only (or going): no store round trip
        state.claim_due = False  # a hint arriving from now on asks for another round
        while not state.stopping and self.claim_batch():
            pass

    def claim_batch(self) -> bool:
        """Claim queued tasks up to the free slots and start them; False when there was
        nothing to claim (or no slot, or the worker stops or drains). A drain may begin
        while a claim is made (after this round looked): what that claim took goes back
        at once, so that no claim a draining worker makes is kept."""
        state = self.state
        with state.lock:
            free = 0 if state.draining else state.slots_free()
        if free <= 0:
            return False
        claims = self.store.claim(state.owner, limit=free, lease=state.lease)
        if not claims:
            return False
        if state.draining:
            self.store.release(state.owner, [claim["task_id"] for claim in claims])
            return False
        # every claim joins the runs at once, so that its lease is renewed while the
        # ones before it start (a model load may outlast a lease)
        runs = [
            Run(
                claim["task_id"],
                claim["model"],
                attempt=claim.get("attempts", 0),
                state=claim.get("status") or "queued",
            )
            for claim in claims
        ]
        self.take_runs(runs)
        for run, claim in zip(runs, claims):
            if state.stopping:
                return False  # still claimed: release() in stop() hands them back
            self.advance(run, claim)
        return True

    def take_runs(self, runs: list[Run]) -> None:
        """Enter new claims in the runs; an older run of the same task (taken from this
        worker by a recovery meanwhile) stops."""
        state = self.state
        stale = []
        with state.lock:
            for run in runs:
                old = state.runs.get(run.task_id)
                if old is not None:
                    stale.append(old)
                    if old.seq is not None:
                        state.by_seq.pop(old.key(), None)
                state.runs[run.task_id] = run
        for old in stale:
            log.warning("task %s was recovered from this worker and claimed again; its old run stops", old.task_id)
            old.cancel_sequence()

    def advance(self, run: Run, claim: ClaimRecord) -> None:
        """Start (or fail) a claimed task; a transient error keeps the claim and retries it later.

        A claimed task must end up submitted, failed in the store, or dropped
        because the store says it is no longer ours to run. (The lease renewal
        extends only the tasks in the runs: one forgotten anyway waits for its
        lease to run out and for recovery to apply its restart policy.)
        """
        with self.state.lock:
            if self.state.runs.get(run.task_id) is not run:
                return  # an earlier claim of a task claimed again since
        try:
            if run.failure is not None:
                self.fail(run, *run.failure)
            else:
                try:
                    self.start_run(run, claim)
                except EngineGone:  # unloaded as it started: load it again
                    self.start_run(run, claim)
        except IllegalTransition as exc:  # cancelled meanwhile, or the claim was lost
            log.info("task %s dropped: %s", run.task_id, exc.message)
            self.state.forget(run)
            self.state.waiters.notify([run.task_id])
        except Unavailable as exc:  # the store cannot be written now (busy, disk full): never the task's fault
            self.retry_later(run, claim, exc)
        except ServerWait as exc:
            if run.waits == 0:
                log.warning("task %s waits for its model's RPC server: %s", run.task_id, exc)
            run.waits += 1
            run.retry_at = time.monotonic() + SERVER_WAIT
            self.retry.append((run, claim))
        except Exception as exc:
            run.tries += 1
            if run.failure is None and run.tries >= START_TRIES:
                log.error("task %s could not start after %d tries: %s", run.task_id, run.tries, exc)
                run.failure = ("internal_error", f"the task could not start: {exc}")
            else:
                log.warning("task %s: %s (will retry)", run.task_id, exc)
            run.retry_at = time.monotonic() + min(MAX_BACKOFF, 0.1 * 2**run.tries)
            self.retry.append((run, claim))

    def retry_later(self, run: Run, claim: ClaimRecord, exc: Unavailable) -> None:
        """A claimed task whose start (or failure) the store could not take: it keeps
        its claim and its state, and the same step is tried again, however long the
        store takes to come back; it does not count towards ``START_TRIES``."""
        run.waits += 1
        if run.waits == 1 or run.waits % STORE_WAIT_LOG_EVERY == 0:
            log.warning("task %s waits for the store (%d tries so far): %s", run.task_id, run.waits, exc.message)
        run.retry_at = time.monotonic() + min(MAX_BACKOFF, 0.1 * 2 ** min(run.waits, 8))
        self.retry.append((run, claim))

    # ---------------------------------------------------------------- a task's start
    def start_run(self, run: Run, claim: ClaimRecord) -> None:
        """Load the model if needed, render the prompt and submit it (or fail the task)."""
        engine = self.engine_for(run)
        if engine is None:
            return  # the task failed
        request = claim.get("request") or {}
        try:
            kwargs = prompting.sampling(request, self.state.config, engine)
            # the chat layer's prompt is its own (a create's check rendered the service's)
            given = None if chat_layer.applies(engine, request) else run.tokens
            tokens = given or prompting.prompt_tokens(engine, request, kwargs["max_tokens"])
        except (ValueError, TypeError) as exc:
            return self.fail(run, "invalid_request", f"the request cannot be rendered: {exc}")
        resume = self.resume_of(claim)
        n_needed = len(tokens) + (len(resume["generated"]) if resume else 0)
        if n_needed >= engine.n_ctx:
            return self.fail(
                run,
                "context_length_exceeded",
                f"the prompt is {len(tokens)} tokens; the model's context holds {engine.n_ctx}",
            )
        self.set_state(run, "running")
        emitted = resume["emitted"] if resume else ""
        shaper = chat_layer.shaper(engine, request, claim.get("item_id") or "", emitted, resume)
        run.calls = shaper if shaper is not None else CallShaper.for_request(request, emitted)
        keep = kv.continuable(request, response_id=claim.get("response_id") or "")
        self.submit(run, engine, tokens, kwargs, resume, claim.get("client_id") or "", keep)

    def engine_for(self, run: Run) -> Engine | None:
        """The engine of the run's model, loaded (the task ``loading`` meanwhile) when it is
        not; None when the task failed instead. A loaded model whose file changed is
        unloaded first: the load finds out whether its digest still holds."""
        registry = self.state.registry
        engine = registry.engine(run.model)
        if engine is not None and registry.file_changed(run.model):
            self.retire_changed(run.model)
            engine = None
        if engine is not None:
            return engine
        if run.state == "queued":
            self.set_state(run, "loading")
        try:
            if registry.waits_for_server(run.model):  # reload_lost loads it once its servers answer
                raise ServerWait(f"model {run.model} waits for its RPC servers")
            return registry.load(run.model)
        except NotFound:
            self.fail(run, "model_not_found", f"model {run.model} is not registered")
        except Unavailable:
            raise  # a busy store: retry
        except LMSPError as exc:  # changed, missing or refused by the engine
            if getattr(exc, "unreachable", False) and registry.waits_for_server(run.model):
                raise ServerWait(exc.message) from None
            self.fail(run, getattr(exc, "task_code", exc.code), exc.message)
        return None

    def reload_lost(self) -> None:
        """Load again the models that lost an RPC server, once it answers (the load greets
        it first: a refusal costs a connection attempt)."""
        registry = self.state.registry
        for model_id in registry.lost():
            try:
                if registry.servers_answer(model_id):
                    registry.load(model_id)
            except NotFound:
                registry.forget_lost(model_id)
            except LMSPError as exc:
                log.debug("model %s still waits for its RPC server: %s", model_id, exc)

    def set_state(self, run: Run, new: str) -> None:
        """Move the task to ``loading`` or ``running`` in the store (once) and wake its waiters."""
        if run.state == new:
            return
        if new == "loading":
            self.store.set_loading(run.task_id, self.state.owner)
        else:
            self.store.set_running(run.task_id, self.state.owner)
        run.state = new
        self.state.waiters.notify([run.task_id])

    def resume_of(self, claim: ClaimRecord) -> dict[str, Any] | None:
        """What the engine continues a recovered ``resume`` task from: its snapshot."""
        snapshot = claim.get("resume") if claim.get("status") == "running" else None
        if not snapshot:
            return None
        return {
            "generated": list(snapshot.get("generated") or ()),
            "emitted": snapshot.get("emitted") or "",
            "logprobs": list(snapshot.get("logprobs") or ()),
            "kv_state": read_kv(snapshot.get("kv_path")),
        }

    def submit(
        self,
        run: Run,
        engine: Engine,
        tokens: list[int],
        kwargs: dict[str, Any],
        resume: dict[str, Any] | None,
        cache_key: str,
        keep: bool,
    ) -> None:
        """Hand the task to the engine, unless its engine left the registry meanwhile
        (:class:`EngineGone`: the start is tried again). ``keep``: its turn's KV goes
        to a file (:func:`.kv.continuable`)."""
        from .. import native  # the extension loads in the workers only

        state = self.state
        # a KV file of the prompt's start, read before the lock (a resumed task has its own state)
        ticket = state.kvdisk.prepare(engine, run.model, tokens, cache_key, look=resume is None, keep=keep)
        try:
            with state.lock:
                if state.registry.engine(run.model) is not engine:  # unloaded since: load it again
                    raise EngineGone(f"model {run.model} was unloaded as the task started")
                run.engine, run.seq = (
                    engine,
                    engine.submit(
                        tokens, resume=resume, cache_key=cache_key, **kwargs, **state.kvdisk.submit_kwargs(ticket)
                    ),
                )
                state.by_seq[run.key()] = run
                state.kvdisk.submitted(engine, run.seq, ticket)
                cancel = run.cancel
        except native.ContextLengthError as exc:
            return self.fail(run, "context_length_exceeded", str(exc))
        except native.BackendLostError as exc:  # the engine lost an RPC server: load it again
            state.registry.lose(run.model, engine, str(exc))
            raise EngineGone(str(exc)) from None
        except (ValueError, TypeError) as exc:
            return self.fail(run, "invalid_request", str(exc))
        if cancel:
            run.cancel_sequence()
        state.commit_wake.set()
        log.debug(
            "task %s: %s as sequence %s (%d prompt tokens)",
            run.task_id,
            "resumed" if resume else "started",
            run.seq,
            len(tokens),
        )

    def fail(self, run: Run, code: str, message: str) -> None:
        """Fail a claimed task in the store (a cancel accepted before wins there)."""
        run.failure = (code, message)
        self.store.fail_task(run.task_id, self.state.owner, code=code, message=message)
        self.state.stats.finish("error", 0, None, None)
        self.state.forget(run)
        self.state.waiters.notify([run.task_id])
        self.state.wake_scheduler()


def read_kv(path: str | None) -> bytes | None:
    """A task's KV snapshot; None when it has none (or it cannot be read: resume then
    re-reads the prompt and the generated tokens)."""
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None
