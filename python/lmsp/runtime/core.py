"""The worker runtime: the scheduler and the commit path between store and engine.

Per worker process:

* the **scheduler thread** claims queued tasks up to the free engine slots
  (a request that finds a free slot and its model loaded has its task claimed
  in the transaction that creates it: :meth:`Runtime.reserve`),
  loads the model when needed (task ``loading``), renders the prompt and
  submits it to the engine (task ``running``), resuming recovered tasks from
  their snapshot;
* the **commit thread** sleeps on the engines' result descriptors, drains
  ``engine.poll()``, writes everything it drained in ONE ``store.append_step``
  transaction (all running tasks together), then wakes the requests waiting
  for those tasks. Group commit: output keeps gathering for up to
  ``commit_window_ms`` after the first uncommitted result, so one transaction
  (one fsync) carries several engine steps; a task's first text and its end
  are committed at once (while a window gathers, the thread sleeps on the
  engines' urgent descriptors, which only a sequence's first text and its
  end make readable). The
  rows a commit wrote for the tasks it left running are kept until the next
  one, so that this worker's streams take them from memory
  (:meth:`Runtime.committed_events`) instead of reading them back. It also renews the leases (acting on cancels made by other
  processes) and recovers the tasks of dead workers (leases expired);
* the **watch thread** serves the requests that wait for the events of a task
  this worker does not run (queued, or run by another worker): one read of
  every such task's sequence counter per round, instead of one per waiting
  request, and it wakes those whose task moved.

All three are real OS threads also under gevent. A store error in the commit thread
keeps the results in memory and retries with backoff; nothing is lost and
nothing is written twice (the items of a failed transaction are merged with
the next results and written together).
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import time
import weakref
from dataclasses import dataclass, field

from .. import ids
from ..config import RECOVERED_ENV
from ..hubsafe import offload
from ..objects import event_object
from ..store.db import no_wait
from ..errors import (ContextLengthExceeded, IllegalTransition, InvalidRequest, LMSPError, ModelInUse, NotFound,
                      Unavailable)
from . import prompt as prompting
from .changed_files import ChangedFiles
from ._threads import RealThread, Wakeup, allocate_lock, gevent_active
from .metrics import Metrics
from .registry import CHANGED, MISSING, ModelRegistry
from .waiters import CommitWaiters

log = logging.getLogger("lmsp.runtime")

IDLE_WAIT = 0.5          # seconds a loop sleeps when nothing wakes it
MAX_BACKOFF = 2.0        # seconds between retries of a failed commit
# Bench only (bench/serve.py --servers lmsp-noevents), never for real use: a
# task's text is committed once, when it ends, instead of at every step, so a
# run shows what writing the step events costs. Streams then get the whole
# text at the end.
BENCH_DEFER_DELTAS = os.environ.get("LMSP_BENCH_NO_PERSIST_EVENTS") == "1"
# Bench only (bench/serve.py --servers lmsp-memevents), never for real use: the
# events of a running task are made exactly as a commit would make them and
# handed to its streams from memory, but written only when the task ends (all
# of them, in one transaction): streams get every event as they do from a
# commit, so a run shows what the transactions of the steps cost, and nothing
# else. A crash loses the unwritten events.
BENCH_EVENTS_IN_MEMORY = os.environ.get("LMSP_BENCH_EVENTS_IN_MEMORY") == "1"
START_TRIES = 5          # transient errors a claimed task may meet before it fails (a store
                         # that cannot be written is not one: the task waits for it)
STORE_WAIT_LOG_EVERY = 30  # a task waiting for the store is logged on its first try and every 30th
WATCH_SECONDS = 0.25     # rounds of the watch thread while the tasks it watches stand still
WATCH_BUSY_SECONDS = 0.02  # ... and while one of them moved in the last round
JANITOR_FIRST_SECONDS = 60.0  # the janitor's first round after a start (workers spread around it) ...
JANITOR_SECONDS = 600.0       # ... and its rounds after that
FILE_CHECK_SECONDS = 2.0      # the janitor stats the loaded models' files this often (and at once on inotify)

_started: "weakref.WeakSet[Runtime]" = weakref.WeakSet()


def started() -> list["Runtime"]:
    """The runtimes started (and not stopped) in this process, for the server hooks."""
    return list(_started)


@dataclass
class _Run:
    """One claimed task in this process."""
    task_id: str
    model: str
    attempt: int = 0             # the task's attempts when claimed: its steps are for this attempt only
    engine: object = None
    seq: int | None = None
    state: str = "queued"        # the task's state in the store as this worker set it
    cancel: bool = False         # a cancel arrived before the sequence existed
    tries: int = 0               # start attempts that met a transient error
    waits: int = 0               # start attempts the store could not take (it fails nothing)
    retry_at: float = 0.0
    failure: tuple[str, str] | None = None   # (code, message) once it must fail
    claimed_at: float = field(default_factory=time.monotonic)
    first_token: bool = False
    first_text: bool = False
    final: dict | None = field(default=None, repr=False)   # the engine's last result
    # a sequence started before its task committed (Runtime.start_early): its results
    # wait here until the task is adopted; None once they go to the store
    held: list | None = field(default=None, repr=False)


class _EngineGone(Exception):
    """The engine a task was about to start on left the registry: the start is tried again."""


def _merge(item: dict | None, run: _Run, result: dict) -> dict:
    """Fold one engine result into the pending store item of its task (a new one in
    place of an item of an earlier claim of the task, which the store would refuse)."""
    if item is None or item["attempt"] != run.attempt:
        item = {"task_id": run.task_id, "attempt": run.attempt, "delta": "", "tokens": [], "finish": None,
                "error": None, "usage": None, "kv_path": None}
    item["delta"] += result.get("text") or ""
    item["tokens"].extend(result.get("tokens") or ())
    finish = result.get("finish")
    if finish:
        item["finish"] = finish
        if finish == "error":
            item["error"] = {"code": result.get("code") or "engine_error",
                             "message": result.get("error") or "generation failed"}
        item["usage"] = {"input_tokens": int(result.get("n_prompt") or 0),
                         "output_tokens": int(result.get("n_generated") or 0),
                         "cached_tokens": int(result.get("n_cached") or 0)}
    return item


class Runtime(ChangedFiles):
    """What the web layer drives: see the module docstring and ``lmsp.app``."""

    def __init__(self, config, store, *, engine_factory=None, clock=time.time,
                 prepare: bool | None = None) -> None:
        """``prepare``: run :func:`lmsp.runtime.prepare` (start-up recovery...) in ``start()``;
        None decides from the environment (False when the gunicorn master already did)."""
        self.config = config
        self._prepare = prepare
        self.store = store
        self.clock = clock
        self.registry = ModelRegistry(config, store, engine_factory)
        self.waiters = CommitWaiters()
        self.stats = Metrics()
        self.owner: str | None = None
        self.ready = False
        self._lock = allocate_lock()           # guards _runs and _by_seq
        self._runs: dict[str, _Run] = {}
        self._by_seq: dict[tuple[int, int], _Run] = {}
        self._stopping = False
        self._draining = False
        self._aborted = False
        self._sched_wake = Wakeup()
        self._commit_wake = Wakeup()
        self._watch_wake = Wakeup()
        self._janitor_wake = Wakeup()
        self._threads: list[RealThread] = []
        self._pending: dict[str, dict] = {}    # task id -> store item not yet committed (commit thread only)
        self._pending_since = 0.0              # when the oldest uncommitted result arrived
        self._urgent = False                   # a first text or an end is pending: commit now
        # task id -> (item_id, event rows) of its latest commit, for this worker's streams
        # (replaced whole by the commit thread; read by the streams)
        self._committed: dict[str, tuple] = {}
        # bench only (BENCH_EVENTS_IN_MEMORY, commit thread): per task, its steps not written
        # yet and the state append_step would continue them from
        self._unwritten: dict[str, list[dict]] = {}
        self._unwritten_state: dict[str, tuple] = {}
        self.window = float(config.commit_window_ms) / 1000.0
        self._retry: list[tuple[_Run, dict]] = []  # claims to start again (scheduler thread only)
        self._reserved = 0                     # slots promised to tasks being created (under _lock)
        self._adopted: list[tuple[_Run, dict]] = []  # tasks created claimed, to start (under _lock)
        self._early: list[_Run] = []           # sequences started for tasks being created (under _lock)
        self._close_when_idle: set[str] = set()  # deleted models still in use here (under _lock)
        self._released: list[_Run] = []        # early runs adopted, results to take (under _lock)
        # task id -> {waiter: the sequence number it waits to pass}, for tasks not run here (under _lock)
        self._watched: dict[str, dict] = {}
        self.watches_store = False             # the watch thread runs: waiters need not poll the store
        self._claim_due = True                 # the store may hold claimable tasks: look on the next round
        self._orphans_due = False              # an engine was closed under its runs: end them now
        self._next_renew = self._next_recover = 0.0
        self.lease = float(config.lease_seconds)

    # life cycle
    def start(self) -> None:
        """Start the loops (in the worker, after fork). Runs start-up recovery unless the master did."""
        if self._threads:
            return
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{ids.new_id('wrk')[-10:]}"
        if self._prepare or (self._prepare is None and not os.environ.get(RECOVERED_ENV)):
            from .service import prepare
            prepare(self.config, self.store, registry=self.registry)
        self._threads = [RealThread(self._scheduler_loop, "lmsp-scheduler"),
                         RealThread(self._commit_loop, "lmsp-commit"),
                         RealThread(self._watch_loop, "lmsp-watch"),
                         RealThread(self._janitor_loop, "lmsp-janitor")]
        for thread in self._threads:
            thread.start()
        self.watches_store = True
        self.ready = True
        _started.add(self)
        log.info("runtime %s started (%s)", self.owner, "gevent" if gevent_active() else "threads")

    def drain(self) -> None:
        """The worker is going (SIGTERM): claim no more queued tasks and take no more
        new ones (a request that would create one gets 503, on every connection still
        open, and retries elsewhere or after the restart), but run on what is claimed
        until :meth:`stop`. ``/readyz`` says not ready.
        Once only: a worker may get SIGTERM twice (systemd signals every process of
        the service, and gunicorn's master then signals its workers)."""
        if self._draining:
            return
        self._draining = True
        log.info("runtime %s draining: no more claims", self.owner)

    @property
    def draining(self) -> bool:
        return self._draining

    def busy(self) -> int:
        """Tasks claimed here and not finished (starting, loading or running), and
        slots promised to tasks being created."""
        with self._lock:
            return len(self._runs) + self._reserved

    def end_streams(self) -> None:
        """The worker stops now: every stream and every wait for a task's events
        returns at once and ends (see :attr:`streams_ending`)."""
        self.waiters.close()

    @property
    def streams_ending(self) -> bool:
        return self.waiters.closed

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop: no more claims, commit what the engine already produced, release the claims.

        Tasks still running stay in the store; the next start (or another
        worker) applies their restart policy.
        """
        if self._stopping:
            return
        self._stopping = True
        self.ready = False
        _started.discard(self)
        deadline = time.monotonic() + timeout
        self._sched_wake.set()
        self._commit_wake.set()
        self._watch_wake.set()
        self._janitor_wake.set()
        for thread in self._threads:
            if not thread.join(max(0.0, deadline - time.monotonic())):
                log.warning("thread %s did not stop within %.1f s", thread.name, timeout)
        if self.owner is not None:
            try:
                self.store.release(self.owner)
            except Exception:
                log.exception("releasing the claims of %s failed", self.owner)
        self.registry.close()
        with self._lock:
            self._runs.clear()
            self._by_seq.clear()
        if all(not t.alive for t in self._threads):
            self._sched_wake.close()
            self._commit_wake.close()
            self._watch_wake.close()
            self._janitor_wake.close()
        log.info("runtime %s stopped", self.owner)

    def abort(self) -> None:
        """Stop at once as if the process died: nothing more is committed, no claim is released.

        What is left is what a crash leaves: the tasks keep their state and
        their leases run out, so recovery (at start-up, or another worker's
        lease check) applies their restart policy.
        """
        self._aborted = True
        self._stopping = True
        self.ready = False
        _started.discard(self)
        self._sched_wake.set()
        self._commit_wake.set()
        self._watch_wake.set()
        self._janitor_wake.set()
        for thread in self._threads:
            thread.join(10.0)
        self.registry.close()

    # hints from the web layer
    def notify_queued(self) -> None:
        self._wake_scheduler()

    def _wake_scheduler(self) -> None:
        """Wake the scheduler to claim from the store (a task was queued or a slot came free)."""
        self._claim_due = True
        self._sched_wake.set()

    def reserve(self, model_id: str) -> tuple[str, float] | None:
        """A free engine slot of this worker for a task about to be created, as the
        ``claim=(owner, lease)`` of ``store.create_task``; None when there is none
        (or the model is not loaded here): the task is then queued as usual.
        Every reservation ends with one :meth:`adopt` call."""
        if not self.ready or self._stopping or self._draining or self.registry.engine(model_id) is None:
            return None
        with self._lock:
            if int(self.config.n_parallel) - len(self._runs) - self._reserved <= 0:
                return None
            self._reserved += 1
        return self.owner, self.lease

    def start_early(self, model_id: str, tokens: list[int] | None, request: dict,
                    client_id: str | None = None) -> _Run | None:
        """Start the sequence of a task being created in a reserved slot, before its
        creation commits, so that the prefill runs meanwhile; pass the result to
        :meth:`adopt`. Nothing of it reaches the store or a client before the task
        is adopted: its results are held until then, and dropped with the sequence
        if the task is not created here. None when it cannot start early (the
        scheduler then starts the task as usual). ``client_id``: the task's client,
        the scope of the engine's prefix cache."""
        engine = self.registry.engine(model_id)
        if engine is None or not tokens or self._stopping:
            return None
        try:
            kwargs = prompting.sampling(request, self.config)
        except (ValueError, TypeError):
            return None
        run = _Run("", model_id, state="running", held=[])
        try:
            with self._lock:
                if self.registry.engine(model_id) is not engine:
                    return None  # unloaded meanwhile: the scheduler loads it
                seq = engine.submit(tokens, cache_key=client_id or "", **kwargs)
                run.engine, run.seq = engine, seq
                self._by_seq[(id(engine), seq)] = run
                self._early.append(run)
        except Exception as exc:  # the usual start reports it on the task
            log.debug("early start refused: %s", exc)
            return None
        return run

    def adopt(self, claim: dict | None, tokens: list[int] | None = None, early: _Run | None = None) -> None:
        """End a reservation: start the task ``create_task`` claimed for this worker
        (its claim record), or give the slot back (None: not claimed, or failed).
        ``tokens``: the prompt as :meth:`check_request` rendered it; ``early``: what
        :meth:`start_early` returned, whose sequence becomes the task's."""
        dropped = None
        with self._lock:
            self._reserved -= 1
            if early is not None:
                self._early.remove(early)
            if claim is None:
                self._claim_due = True  # the slot is free again
                dropped = early
            elif self._stopping:
                dropped = early
            elif early is not None:
                early.task_id, early.attempt = claim["task_id"], claim.get("attempts", 0)
                self._runs[early.task_id] = early
                self._released.append(early)
            else:
                if tokens:
                    claim = dict(claim, tokens=tokens)
                run = _Run(claim["task_id"], claim["model"], attempt=claim.get("attempts", 0), state="running")
                self._runs[run.task_id] = run
                self._adopted.append((run, claim))
            if dropped is not None:
                self._by_seq.pop((id(dropped.engine), dropped.seq), None)
        if dropped is not None:
            try:
                dropped.engine.cancel(dropped.seq)
            except Exception:  # closed meanwhile: nothing runs
                pass
        if early is not None and dropped is None:
            self._commit_wake.set()  # its held results, a first token among them maybe
            return
        # a claim left when stopping keeps its lease, which runs out: recovery applies its policy
        self._sched_wake.set()

    def notify_cancel(self, task_id: str) -> None:
        with self._lock:
            run = self._runs.get(task_id)
            if run is not None:
                run.cancel = True
                engine, seq = run.engine, run.seq
        if run is not None and engine is not None and seq is not None:
            try:
                engine.cancel(seq)
            except Exception as exc:  # closed engine: the renew loop settles it
                log.debug("cancel of %s: %s", task_id, exc)
        self.waiters.notify([task_id])

    def commit_generation(self) -> int:
        """A number that changes with every commit this process announces (see wait_for_commit)."""
        return self.waiters.generation

    def committed_events(self, task_id: str, after: int) -> list[dict] | None:
        """The task's events after ``after`` from the latest commit this worker made
        for it, when that commit wrote every one of them; None when it did not (or
        when there is nothing new): then the store has them.

        A stream of a task running here gets its events without reading them back:
        they are the rows of a transaction that has committed, the same rows a read
        would return, and no event is handed out before its commit.
        """
        entry = self._committed.get(task_id)
        if entry is None:
            return None
        item_id, rows = entry
        first = rows[0][0]
        if not first <= after + 1 <= rows[-1][0]:
            return None
        keys = self.store.EVENT_ROW
        return [event_object(dict(zip(keys, row)), item_id) for row in rows[after + 1 - first:]]

    def wait_for_commit(self, task_id: str, after_seq: int, timeout: float, since: int | None = None) -> None:
        """Return once the task has events after ``after_seq`` (or on timeout).

        ``since``: :meth:`commit_generation` read before the caller last read the
        events. For a task this process runs, every commit of its events is
        announced, so an unchanged generation proves nothing new was committed
        and the store need not be asked. A task run elsewhere, by nobody yet,
        or claimed here but not decoding yet (which others may still cancel),
        is left to the watch thread, which reads the counters of all such
        tasks at once and wakes the waiters of those that passed their number;
        without it (the runtime not started) the store is asked here.
        """
        waiter = self.waiters.register(task_id)
        watched = False
        try:
            run = self._runs.get(task_id)
            if run is not None and since is not None and self.waiters.generation != since:
                return
            # a task claimed here but not decoding yet (its model loading, say) can still
            # be moved by others: a cancel from another process ends it at once
            decoding_here = run is not None and run.seq is not None
            if not decoding_here:
                with self._lock:  # the watch thread's end clears the flag under it
                    if self.watches_store:
                        self._watched.setdefault(task_id, {})[waiter] = after_seq
                        watched = True
            if not watched and not (decoding_here and since is not None):
                try:
                    # on the gevent hub a read must not wait out a lock (that would stop
                    # every greenlet): a busy store returns at once, like an unknown task
                    with no_wait() if gevent_active() else contextlib.nullcontext():
                        if self.store.last_sequence(task_id) > after_seq:
                            return
                except LMSPError:
                    return  # unknown task or busy store: let the caller re-read and decide
            waiter.wait(timeout)
        finally:
            if watched:
                with self._lock:
                    group = self._watched.get(task_id)
                    if group is not None:
                        group.pop(waiter, None)
                        if not group:
                            del self._watched[task_id]
            self.waiters.unregister(task_id, waiter)

    def check_request(self, model_id: str, prompt_messages: list[dict]) -> list[int] | None:
        """The prompt's tokens when the model is loaded here (None: checked at run time);
        ContextLengthExceeded when it cannot fit with one output token."""
        engine = self.registry.engine(model_id)
        if engine is None:
            return None
        try:
            tokens = prompting.render(engine, prompt_messages)
        except ValueError as exc:  # what the chat template or the tokenizer refuses: so would the run
            raise InvalidRequest(f"the request cannot be rendered: {exc}", param="input") from None
        except Exception as exc:  # a closed engine (unloaded meanwhile): check at run time
            log.debug("check_request: %s", exc)
            return None
        n = len(tokens)
        if n >= engine.n_ctx:
            raise ContextLengthExceeded(
                f"the prompt is {n} tokens; model {model_id} takes at most {engine.n_ctx - 1} "
                "with room for one output token", param="input")
        return tokens

    # the model registry
    def register_model(self, path: str, model_id: str | None = None, progress=None, *,
                       confined: bool = True) -> dict:
        return self._offload(self.registry.register, path, model_id, progress, confined=confined)

    def load_model(self, model_id: str) -> dict:
        self._offload(self.registry.load, model_id)
        return self.registry.object(model_id)

    def unload_model(self, model_id: str) -> dict:
        self.store.get_model(model_id)  # NotFound
        engine = self._detach_engine(model_id)
        if engine is not None:
            self._offload(self.registry.close_engine, model_id, engine)
        return self.registry.object(model_id)

    def delete_model(self, model_id: str) -> None:
        self._refuse_if_busy(model_id)
        self._offload(self._delete_model, model_id)

    def _delete_model(self, model_id: str) -> None:
        self.store.delete_model(model_id)  # ModelInUse while unfinished tasks need it
        try:
            engine = self._detach_engine(model_id)
        except ModelInUse:  # a task that started meanwhile ends on it first
            with self._lock:
                self._close_when_idle.add(model_id)
            log.info("model %s deleted while a task runs on it; it unloads when its tasks end", model_id)
            return
        if engine is not None:
            self.registry.close_engine(model_id, engine)

    def _close_deleted(self) -> None:
        """Unload the engines of deleted models whose last tasks have ended (commit thread)."""
        with self._lock:
            pending = list(self._close_when_idle)
        for model_id in pending:
            try:
                engine = self._detach_engine(model_id)
            except ModelInUse:
                continue
            with self._lock:
                self._close_when_idle.discard(model_id)
            if engine is not None:
                self.registry.close_engine(model_id, engine)

    def _detach_engine(self, model_id: str):
        """The model's engine, out of the registry once no task of this worker uses
        it (ModelInUse otherwise): one step under the lock a task's start takes to
        submit, so no task can start on an engine about to close."""
        with self._lock:
            self._check_idle(model_id)
            return self.registry.detach(model_id)

    def model_object(self, model_id: str) -> dict:
        found = self.registry.object(model_id)
        self._retire_if_changed([found])
        return found

    def list_models(self) -> list[dict]:
        found = self.registry.objects()
        self._retire_if_changed(found)
        return found

    def _retire_if_changed(self, models: list[dict]) -> None:
        """Unload the models shown changed (or missing) that are still loaded here."""
        for model in models:
            if model["state"] in (CHANGED, MISSING) and self.registry.engine(model["id"]) is not None:
                self._offload(self.retire_changed, model["id"])

    def metrics(self) -> dict:
        figures = self.stats.snapshot()
        with self._lock:
            runs = list(self._runs.values())
        figures["claimed_tasks"] = len(runs)
        figures["active_sequences"] = sum(1 for r in runs if r.seq is not None)
        figures["queue_depth"] = sum(1 for r in runs if r.seq is None)  # claimed here, not decoding yet
        figures["engine_slots"] = int(self.config.n_parallel)
        engines = self.registry.engines()
        figures["loaded_models"] = [model_id for model_id, _ in engines]
        steps, passes = {}, {}
        for model_id, engine in engines:
            try:
                counts = engine.stats()
            except Exception:  # closed meanwhile, or an engine without counters
                continue
            steps[model_id] = counts.get("steps", 0)
            passes[model_id] = counts.get("ubatches", counts.get("steps", 0))
        figures["engine_steps"] = steps
        figures["engine_ubatches"] = passes
        figures["waiting_requests"] = self.waiters.waiting()
        figures["ready"] = self.ready
        return figures

    # helpers
    def _refuse_if_busy(self, model_id: str) -> None:
        """NotFound for an unknown model; ModelInUse while this worker runs tasks on it."""
        self.store.get_model(model_id)
        with self._lock:
            self._check_idle(model_id)

    def _check_idle(self, model_id: str) -> None:
        """ModelInUse while this worker runs or starts tasks on the model (under _lock)."""
        if any(r.model == model_id for r in (*self._runs.values(), *self._early)):
            raise ModelInUse(f"model {model_id} is generating; cancel its tasks or wait for them")

    @staticmethod
    def _offload(fn, *args, **kwargs):
        """Run blocking work (hashing, loading) off the gevent hub; plain call otherwise."""
        return offload(fn, *args, **kwargs)

    # ---------------------------------------------------------------- scheduler thread
    def _scheduler_loop(self) -> None:
        backoff = 0.0
        while not self._stopping:
            if not self._sched_wake.wait(backoff or IDLE_WAIT):
                self._claim_due = True  # idle: look for tasks queued by other workers or recovered
            if self._stopping:
                break
            try:
                self._claim_some()
                backoff = 0.0
            except Exception as exc:  # a busy store: try again soon
                self._claim_due = True
                backoff = min(MAX_BACKOFF, (backoff or 0.05) * 2)
                log.warning("claiming tasks failed (retry in %.2f s): %s", backoff, exc)

    def _claim_some(self) -> None:
        with self._lock:
            adopted, self._adopted = self._adopted, []
        for run, claim in adopted:
            self._advance(run, claim)
        now = time.monotonic()
        due = [entry for entry in self._retry if entry[0].retry_at <= now]
        self._retry = [entry for entry in self._retry if entry[0].retry_at > now]
        for run, claim in due:
            if self._stopping:
                return  # still claimed: release() in stop() hands them back
            self._advance(run, claim)
        if not self._claim_due or self._draining:
            return  # woken for tasks adopted at creation only (or going): no store round trip
        self._claim_due = False  # a hint arriving from now on asks for another round
        while not self._stopping:
            with self._lock:
                free = int(self.config.n_parallel) - len(self._runs) - self._reserved
            if free <= 0:
                return
            claims = self.store.claim(self.owner, limit=free, lease=self.lease)
            if not claims:
                return
            # every claim joins _runs at once, so that its lease is renewed while the
            # ones before it start (a model load may outlast a lease)
            runs = [_Run(claim["task_id"], claim["model"], attempt=claim.get("attempts", 0),
                         state=claim.get("status") or "queued") for claim in claims]
            stale = []
            with self._lock:
                for run in runs:
                    old = self._runs.get(run.task_id)
                    if old is not None:  # taken from this worker by a recovery meanwhile
                        stale.append(old)
                        if old.seq is not None:
                            self._by_seq.pop((id(old.engine), old.seq), None)
                    self._runs[run.task_id] = run
            for old in stale:
                log.warning("task %s was recovered from this worker and claimed again; its old run stops",
                            old.task_id)
                if old.seq is not None:
                    try:
                        old.engine.cancel(old.seq)
                    except Exception:  # closed meanwhile: nothing runs
                        pass
            for run, claim in zip(runs, claims):
                if self._stopping:
                    return  # still claimed: release() in stop() hands them back
                self._advance(run, claim)

    def _advance(self, run: _Run, claim: dict) -> None:
        """Start (or fail) a claimed task; a transient error keeps the claim and retries it later.

        A claimed task must end up submitted, failed in the store, or dropped
        because the store says it is no longer ours to run. (The lease renewal
        extends only the tasks in ``_runs``: one forgotten anyway waits for its
        lease to run out and for recovery to apply its restart policy.)
        """
        with self._lock:
            if self._runs.get(run.task_id) is not run:
                return  # an earlier claim of a task claimed again since
        try:
            if run.failure is not None:
                self._fail(run, *run.failure)
            else:
                try:
                    self._start_run(run, claim)
                except _EngineGone:  # unloaded as it started: load it again
                    self._start_run(run, claim)
        except IllegalTransition as exc:  # cancelled meanwhile, or the claim was lost
            log.info("task %s dropped: %s", run.task_id, exc.message)
            self._forget(run)
            self.waiters.notify([run.task_id])
        except Unavailable as exc:  # the store cannot be written now (busy, disk full): never the task's fault
            self._retry_later(run, claim, exc)
        except Exception as exc:
            run.tries += 1
            if run.failure is None and run.tries >= START_TRIES:
                log.error("task %s could not start after %d tries: %s", run.task_id, run.tries, exc)
                run.failure = ("internal_error", f"the task could not start: {exc}")
            else:
                log.warning("task %s: %s (will retry)", run.task_id, exc)
            run.retry_at = time.monotonic() + min(MAX_BACKOFF, 0.1 * 2 ** run.tries)
            self._retry.append((run, claim))

    def _retry_later(self, run: _Run, claim: dict, exc: Unavailable) -> None:
        """A claimed task whose start (or failure) the store could not take: it keeps
        its claim and its state, and the same step is tried again, however long the
        store takes to come back; it does not count towards ``START_TRIES``."""
        run.waits += 1
        if run.waits == 1 or run.waits % STORE_WAIT_LOG_EVERY == 0:
            log.warning("task %s waits for the store (%d tries so far): %s", run.task_id, run.waits, exc.message)
        run.retry_at = time.monotonic() + min(MAX_BACKOFF, 0.1 * 2 ** min(run.waits, 8))
        self._retry.append((run, claim))

    def _start_run(self, run: _Run, claim: dict) -> None:
        from .. import native

        task_id, request = run.task_id, claim.get("request") or {}
        engine = self.registry.engine(run.model)
        if engine is not None and self.registry.file_changed(run.model):
            self.retire_changed(run.model)  # the load below finds out whether its digest still holds
            engine = None
        if engine is None:
            if run.state == "queued":
                self.store.set_loading(task_id, self.owner)
                run.state = "loading"
                self.waiters.notify([task_id])
            try:
                engine = self.registry.load(run.model)
            except NotFound:
                return self._fail(run, "model_not_found", f"model {run.model} is not registered")
            except Unavailable:
                raise  # a busy store: retry
            except LMSPError as exc:  # changed, missing or refused by the engine
                return self._fail(run, getattr(exc, "task_code", exc.code), exc.message)
        try:
            tokens = claim.get("tokens") or prompting.render(engine, prompting.messages_for(request))
            kwargs = prompting.sampling(request, self.config)
        except (ValueError, TypeError) as exc:
            return self._fail(run, "invalid_request", f"the request cannot be rendered: {exc}")
        snapshot = claim.get("resume") if claim.get("status") == "running" else None
        resume = None
        if snapshot:
            resume = {"generated": list(snapshot.get("generated") or ()),
                      "emitted": snapshot.get("emitted") or "",
                      "kv_state": self._read_kv(snapshot.get("kv_path"))}
        n_needed = len(tokens) + (len(resume["generated"]) if resume else 0)
        if n_needed >= engine.n_ctx:
            return self._fail(run, "context_length_exceeded",
                              f"the prompt is {len(tokens)} tokens; the model's context holds {engine.n_ctx}")
        if run.state != "running":
            self.store.set_running(task_id, self.owner)
            run.state = "running"
            self.waiters.notify([task_id])
        try:
            with self._lock:
                if self.registry.engine(run.model) is not engine:  # unloaded since: load it again
                    raise _EngineGone(f"model {run.model} was unloaded as the task started")
                seq = engine.submit(tokens, resume=resume, cache_key=claim.get("client_id") or "", **kwargs)
                run.engine, run.seq = engine, seq
                self._by_seq[(id(engine), seq)] = run
                cancel = run.cancel
        except native.ContextLengthError as exc:
            return self._fail(run, "context_length_exceeded", str(exc))
        except (ValueError, TypeError) as exc:
            return self._fail(run, "invalid_request", str(exc))
        if cancel:
            engine.cancel(seq)
        self._commit_wake.set()
        log.debug("task %s: %s as sequence %s (%d prompt tokens)", task_id,
                  "resumed" if resume else "started", seq, len(tokens))

    def _fail(self, run: _Run, code: str, message: str) -> None:
        """Fail a claimed task in the store (a cancel accepted before wins there)."""
        run.failure = (code, message)
        self.store.fail_task(run.task_id, self.owner, code=code, message=message)
        self._forget(run)
        self.waiters.notify([run.task_id])
        self._wake_scheduler()

    def _forget(self, run: _Run) -> None:
        with self._lock:
            if self._runs.get(run.task_id) is run:
                del self._runs[run.task_id]
                self._committed.pop(run.task_id, None)
            if run.seq is not None:
                self._by_seq.pop((id(run.engine), run.seq), None)

    @staticmethod
    def _read_kv(path: str | None) -> bytes | None:
        if not path:
            return None
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except OSError:
            return None  # resume then re-reads the prompt and the generated tokens

    # ---------------------------------------------------------------- watch thread
    def _watch_loop(self) -> None:
        wait = WATCH_SECONDS
        try:
            while not self._stopping:
                self._watch_wake.wait(wait)
                if self._stopping:
                    break
                try:
                    wait = WATCH_BUSY_SECONDS if self._watch_round() else WATCH_SECONDS
                except Exception as exc:  # a busy store: the next round reads again
                    log.debug("watch round failed: %s", exc)
                    wait = WATCH_SECONDS
        finally:
            with self._lock:
                self.watches_store = False  # from now on each waiter asks the store itself
                waiting = list(self._watched)
            self.waiters.notify(waiting)  # ... starting now

    def _watch_round(self) -> bool:
        """One read of the watched tasks' counters; wake the waiters of those that
        passed a waiter's number (or are gone). True when one did."""
        with self._lock:
            if not self._watched:
                return False
            lowest = {task_id: min(group.values()) for task_id, group in self._watched.items() if group}
        last = self.store.last_sequences(lowest)
        moved = [task_id for task_id, after in lowest.items() if last.get(task_id, after + 1) > after]
        if moved:
            self.waiters.notify(moved)
        return bool(moved)

    # ---------------------------------------------------------------- janitor thread
    def _janitor_loop(self) -> None:
        """Retention (LMSP B.10), in every worker: finished tasks with their events and
        responses past ``retention_days``, expired idempotency keys and pairing codes
        go, in small transactions (``Store.gc``); unfinished tasks never do. Between
        its rounds it checks the files of the models loaded here (:mod:`.changed_files`)."""
        next_round = time.monotonic() + JANITOR_FIRST_SECONDS * (0.5 + random.random())
        while not self._stopping:
            watch = self.registry.watch_fileno()
            wait = min(FILE_CHECK_SECONDS, max(0.0, next_round - time.monotonic()))
            self._janitor_wake.wait(wait, [watch] if watch is not None else [])
            if self._stopping:
                break
            try:
                self.check_model_files()
            except Exception:  # a bug must not stop the retention rounds
                log.exception("checking the model files failed")
            if time.monotonic() < next_round:
                continue
            try:
                self._janitor_round()
            except Exception as exc:  # a busy store: the next round does it
                log.warning("retention round failed: %s", exc)
            next_round = time.monotonic() + JANITOR_SECONDS * (0.75 + random.random() / 2)

    def _janitor_round(self) -> dict:
        counts = self.store.gc(retention=float(self.config.retention_days) * 86400.0)
        if any(counts.values()):
            log.info("retention: deleted %s", ", ".join(f"{n} {what}" for what, n in counts.items() if n))
        return counts

    # ---------------------------------------------------------------- commit thread
    def _commit_loop(self) -> None:
        now = time.monotonic()
        self._next_renew = now + self.lease / 3
        self._next_recover = now + self.lease / 2
        backoff = 0.0
        while not self._aborted:
            try:
                backoff, done = self._commit_round(backoff)
            except Exception:  # a bug must not silently stop every task of this worker
                log.exception("commit loop error")
                backoff, done = MAX_BACKOFF, False
            if done:
                break

    def _commit_round(self, backoff: float) -> tuple[float, bool]:
        """One wait-drain-commit round, then the lease housekeeping; (next backoff, finished)."""
        if backoff:
            self._commit_wake.wait(backoff)
        else:
            # gathering a window: only a first text or an end cuts it short,
            # so the engines do not wake this thread for every token
            gathering = bool(self._pending)
            wait = IDLE_WAIT
            if gathering:
                wait = max(0.0, self._pending_since + self.window - time.monotonic())
            self._commit_wake.wait(wait, self._engine_fds(urgent=gathering))
        engines = self.registry.engines()
        stopping = self._stopping
        if self._aborted:
            return 0.0, True
        self._drain(engines)
        due = (self._urgent or stopping or backoff
               or time.monotonic() >= self._pending_since + self.window)
        if self._pending and due and not self._commit():
            backoff = min(MAX_BACKOFF, (backoff or 0.05) * 2)
            if stopping and backoff >= MAX_BACKOFF:
                log.error("giving up on %d uncommitted results at shutdown", len(self._pending))
                return backoff, True
            return backoff, False
        if stopping:
            return 0.0, True
        now = time.monotonic()
        if self._orphans_due:
            self._orphans_due = False
            self._end_orphans()
        if now >= self._next_renew:
            self._next_renew = now + self.lease / 3
            self._renew()
            self._end_orphans()
            self._close_deleted()
        if now >= self._next_recover:
            self._next_recover = now + self.lease / 2
            self._recover_dead()
        return 0.0, False

    def _engine_fds(self, *, urgent: bool) -> list[int]:
        """The descriptors the commit thread waits on. Only their numbers: no engine is
        held while it waits, so one unloaded meanwhile goes (and frees its memory) at
        once; the descriptors of one gone only wake the wait."""
        fds = []
        for _, engine in self.registry.engines():
            try:
                fds.append(engine.urgent_fileno() if urgent else engine.fileno())
            except Exception:  # closed meanwhile
                pass
        return fds

    def _drain(self, engines) -> None:
        if self._released:
            now = time.monotonic()
            with self._lock:
                released, self._released = self._released, []
                for run in released:  # adopted: what they produced meanwhile goes first
                    held, run.held = run.held, None
                    for result in held:
                        self._take(run, result, now)
        for _, engine in engines:
            try:
                results = engine.poll()
            except Exception:  # closed by an unload: nothing more will come
                continue
            if not results:
                continue
            now = time.monotonic()
            with self._lock:
                for result in results:
                    run = self._by_seq.get((id(engine), result.get("seq")))
                    if run is None:
                        continue  # a sequence we gave up (claim lost)
                    if run.held is not None:
                        run.held.append(result)  # its task is not committed yet
                        continue
                    self._take(run, result, now)

    def _take(self, run: _Run, result: dict, now: float) -> None:
        """One engine result into the pending items (under _lock)."""
        if not self._pending:
            self._pending_since = now
        self._pending[run.task_id] = _merge(self._pending.get(run.task_id), run, result)
        if not run.first_token and result.get("tokens"):
            run.first_token = True
            self.stats.first_token(now - run.claimed_at)
        if not run.first_text and result.get("text"):
            # the first text a client will see is not to wait for the window (a first
            # token may show none yet: part of a UTF-8 character, a possible stop string)
            run.first_text = True
            self._urgent = True
        if result.get("finish"):
            run.final = result
            self._urgent = True

    def _commit(self) -> bool:
        items = list(self._pending.values())
        if BENCH_DEFER_DELTAS:
            items = [item for item in items if item["finish"]]
            if not items:
                self._pending_since, self._urgent = time.monotonic(), False  # a new window
                return True
        written = items
        if BENCH_EVENTS_IN_MEMORY:
            items, written = self._bench_in_memory(items)
            if not items:
                return True
        started = time.perf_counter()
        try:
            outcome = self.store.append_step(self.owner, written, with_events=True) or {}
        except Exception as exc:
            self.stats.commit_failed()
            log.warning("committing %d task(s) failed, kept in memory: %s", len(items), exc)
            return False
        n_tokens = sum(len(item["tokens"]) for item in items)
        self.stats.commit(time.perf_counter() - started, n_tokens)
        committed = outcome.get("events")
        if committed:
            self._committed.update(committed)
        self._urgent = False
        if len(items) == len(self._pending):
            self._pending = {}
        else:
            for item in items:
                del self._pending[item["task_id"]]
        done = [item["task_id"] for item in items if item["finish"]]
        if BENCH_EVENTS_IN_MEMORY:
            for task_id in done:
                self._unwritten.pop(task_id, None)
                self._unwritten_state.pop(task_id, None)
        skipped = list(outcome.get("skipped") or ())
        attempts = {item["task_id"]: item["attempt"] for item in items}
        with self._lock:
            ended = [self._pop_run(task_id, attempts[task_id]) for task_id in done + skipped]
            for run in ended:
                if run is not None and run.seq is not None:
                    self._by_seq.pop((id(run.engine), run.seq), None)
        for task_id in done + skipped:
            self._committed.pop(task_id, None)
        for run in ended:
            if run is None:
                continue
            if run.task_id in skipped and run.final is None and run.engine is not None:
                try:
                    run.engine.cancel(run.seq)  # no longer ours: stop spending the slot on it
                except Exception:
                    pass
            elif run.final is not None:
                self.stats.finish(run.final.get("finish") or "error", run.final.get("n_prompt"),
                                  run.final.get("n_cached"), run.final.get("timings"))
        self.waiters.notify([item["task_id"] for item in items])
        if ended:
            self._wake_scheduler()
        return True

    def _pop_run(self, task_id: str, attempt: int) -> _Run | None:
        """The run of ``task_id`` out of ``_runs`` (under _lock), unless the task was
        claimed again since ``attempt``: that run is not the one its items ended."""
        run = self._runs.get(task_id)
        if run is None or run.attempt != attempt:
            return None
        return self._runs.pop(task_id)

    def _bench_in_memory(self, items: list[dict]) -> tuple[list[dict], list[dict]]:
        """BENCH_EVENTS_IN_MEMORY: hand the steps of running tasks to their streams
        without a transaction; return (the ending items, what to write now: each
        ending task's held steps, then its end)."""
        from ..store import step_events

        now = time.time()
        ending, written, shown = [], [], []
        for item in items:
            task_id = item["task_id"]
            if item["finish"]:
                ending.append(item)
                written += self._unwritten.get(task_id, [])
                written.append(item)
                continue
            state = self._unwritten_state.get(task_id)
            if state is None:
                state = self.store.step_state(task_id)
            state, rows = step_events(self.owner, item, state, now)
            self._unwritten_state[task_id] = state
            self._unwritten.setdefault(task_id, []).append(item)
            if rows:
                # every unwritten row stays readable: a stream that slept through a step
                # has no store to read it from
                self._committed.setdefault(task_id, (state.item_id, []))[1].extend(rows)
            del self._pending[task_id]
            shown.append(task_id)
        if not ending:
            self._urgent = False
        if shown:
            self.waiters.notify(shown)
        return ending, written

    def _renew(self) -> None:
        with self._lock:
            running = list(self._runs)
        if not running:
            return  # nothing claimed: no lease to extend
        try:
            cancelling = self.store.renew(self.owner, lease=self.lease, task_ids=running)
        except Exception as exc:
            log.warning("renewing leases failed: %s", exc)
            return
        for task_id in cancelling or ():
            with self._lock:
                run = self._runs.get(task_id)
                if run is not None:
                    run.cancel = True
                engine, seq = (run.engine, run.seq) if run is not None else (None, None)
            if engine is not None and seq is not None:
                try:
                    engine.cancel(seq)
                except Exception:
                    pass

    def _end_orphans(self) -> None:
        """End with an error the runs whose engine closed under them (nothing polls
        a closed engine): otherwise their leases would be renewed for ever. An
        unload waits for a model's tasks, so this is a safety net."""
        with self._lock:
            orphans = [run for run in self._runs.values() if run.engine is not None and run.final is None
                       and run.held is None and getattr(run.engine, "closed", False)]
            if not orphans:
                return
            now = time.monotonic()
            for run in orphans:
                code, message = run.failure or ("engine_error", "the model was unloaded while the task ran")
                log.error("task %s: its engine closed while it ran (%s)", run.task_id, code)
                self._take(run, {"seq": run.seq, "tokens": [], "text": "", "finish": "error",
                                 "error": message, "code": code}, now)

    def _recover_dead(self) -> None:
        try:
            # this worker's own tasks are alive, whatever their lease says (a wall
            # clock stepped forward, renewals refused by a busy store)
            report = self.store.recover(startup=False, exclude_owner=self.owner)
        except Exception as exc:
            log.warning("recovering expired leases failed: %s", exc)
            return
        moved = [t for key in ("failed", "requeued", "resumed", "cancelled") for t in (report or {}).get(key, ())]
        if moved:
            log.warning("recovered %d task(s) of a dead worker: %s", len(moved), report)
            self.waiters.notify(moved)
            self._wake_scheduler()
