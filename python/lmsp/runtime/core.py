"""The worker runtime: the facade over the rooms between the store and the engine.

Per worker process, five real OS threads (also under gevent), each the loop of
a room of its own:

* the **scheduler thread** (:mod:`.scheduler`) claims queued tasks up to the
  free engine slots, loads the model when needed (task ``loading``), renders
  the prompt and submits it to the engine (task ``running``), resuming
  recovered tasks from their snapshot;
* the **commit thread** (:mod:`.committer`) writes the engines' results to the
  store in group commits, wakes the requests waiting for them, renews the
  leases and recovers the tasks of dead workers;
* the **watch thread** (:mod:`.watcher`) serves the requests that wait for the
  events of a task this worker does not run (queued, or run by another
  worker): one read of every such task's sequence counter per round, instead
  of one per waiting request, and it wakes those whose task moved;
* the **janitor thread** (:mod:`.janitor`) applies retention, checks the
  loaded models' files and writes the service's history once a minute
  (:mod:`.history`);
* the **KV thread** (:mod:`.kv`) writes the KV files of finished turns,
  which later prompts load instead of prefilling them.

A request's task comes in through :mod:`.admission` (claimed at its creation
when a slot is free); the model operations are :mod:`.models`'. The rooms share
one :class:`~.state.WorkerState` (the runs, their lock, the wake-ups).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import weakref
from typing import Any

from .. import ids
from ..config import RECOVERED_ENV
from ._threads import RealThread, Wakeup, gevent_active
from .admission import Admission
from .embeddings import Embeddings
from .committer import Committer
from .models import Models
from .registry import ModelRegistry
from .history import HistoryWriter
from .janitor import Janitor
from lmsp.runtime.kv import KvDisk
from .scheduler import Scheduler
from .state import WorkerState
from .watcher import Watcher

log = logging.getLogger("lmsp.runtime")

_started: "weakref.WeakSet[Runtime]" = weakref.WeakSet()


def started() -> list["Runtime"]:
    """The runtimes started (and not stopped) in this process, for the server hooks."""
    return list(_started)


class Runtime:
    """What the web layer drives: see the module docstring and ``lmsp.app``."""

    def __init__(
        self,
        config,
        store,
        *,
        engine_factory=None,
        clock=time.time,
        prepare: bool | None = None,
    ) -> None:
        """``prepare``: run :func:`lmsp.runtime.prepare` (start-up recovery...) in ``start()``;
        None decides from the environment (False when the gunicorn master already did)."""
        self.config = config
        self._prepare = prepare
        self.store = store
        self.clock = clock
        self.registry = ModelRegistry(config, store, engine_factory)
        self.state = WorkerState(config, store, self.registry)
        self.waiters = self.state.waiters
        self.stats = self.state.stats
        self.models = Models(self.state)
        self.kvdisk = self.state.kvdisk = KvDisk(self.state)
        self.committer = Committer(self.state, self.models.close_deleted)
        self.scheduler = Scheduler(self.state, self.models.retire_changed)
        self.admission = Admission(self.state)
        self.embeddings = Embeddings(self.state, self.models)
        self.watcher = Watcher(self.state)
        self.history = HistoryWriter(self.state, clock)
        self.janitor = Janitor(self.state, self.models.check_files, self.history.tick)
        self._threads: list[RealThread] = []
        # what the rooms answer themselves
        self.create_task = self.admission.create_task  # a request's task, created and started or queued
        self.wait_for_commit = self.watcher.wait_for_commit  # the waits of streams and plain requests
        self.committed_events = self.committer.committed_events  # a commit's events, from memory
        self.register_model = self.models.register  # the model registry (see .models)
        self.load_model = self.models.load
        self.unload_model = self.models.unload
        self.delete_model = self.models.delete
        self.model_object = self.models.object
        self.list_models = self.models.objects
        self.check_model_files = self.models.check_files
        self.embed = self.embeddings.embed  # embeddings, each request a task it runs itself
        self.detokenize = self.models.detokenize
        self.prompt_pieces = self.models.prompt_pieces

    @property
    def owner(self) -> str | None:
        """This worker's name in the store's claims (None before the start)."""
        return self.state.owner or None

    @property
    def lease(self) -> float:
        return self.state.lease

    @property
    def watches_store(self) -> bool:
        """The watch thread runs: a waiter is woken when its task moves, whoever runs it."""
        return self.watcher.watching

    @property
    def ready(self) -> bool:
        """Started (start-up recovery done) and not stopped."""
        return self.state.ready

    # life cycle
    def start(self) -> None:
        """Start the loops (in the worker, after fork). Runs start-up recovery unless the master did."""
        if self._threads:
            return
        self.state.owner = f"{socket.gethostname()}:{os.getpid()}:{ids.new_id('wrk')[-10:]}"
        if self._prepare or (self._prepare is None and not os.environ.get(RECOVERED_ENV)):
            from .startup import prepare

            prepare(self.config, self.store, registry=self.registry)
        self._threads = [
            RealThread(self.scheduler.run, "lmsp-scheduler"),
            RealThread(self.committer.run, "lmsp-commit"),
            RealThread(self.watcher.run, "lmsp-watch"),
            RealThread(self.janitor.run, "lmsp-janitor"),
            RealThread(self.kvdisk.run, "lmsp-kv"),
        ]
        for thread in self._threads:
            thread.start()
        self.watcher.watching = True
        self.state.ready = True
        _started.add(self)
        log.info("runtime %s started (%s)", self.owner, "gevent" if gevent_active() else "threads")

    def drain(self) -> None:
        """The worker is going (SIGTERM): claim no more queued tasks and take no more
        new ones (a request that would create one gets 503, on every connection still
        open, and retries elsewhere or after the restart), but run on what is claimed
        until :meth:`stop`. ``/readyz`` says not ready.
        Once only: a worker may get SIGTERM twice (systemd signals every process of
        the service, and gunicorn's master then signals its workers)."""
        if self.state.draining:
            return
        self.state.draining = True
        log.info("runtime %s draining: no more claims", self.owner)

    @property
    def draining(self) -> bool:
        return self.state.draining

    def busy(self) -> int:
        """Tasks claimed here and not finished (starting, loading or running), and
        slots promised to tasks being created."""
        with self.state.lock:
            return len(self.state.runs) + self.state.reserved

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
        if self.state.stopping:
            return
        self.state.stopping = True
        self.state.ready = False
        _started.discard(self)
        deadline = time.monotonic() + timeout
        self._wake_threads()
        for thread in self._threads:
            if not thread.join(max(0.0, deadline - time.monotonic())):
                log.warning("thread %s did not stop within %.1f s", thread.name, timeout)
        if self.owner is not None:
            try:
                self.store.release(self.owner)
            except Exception:
                log.exception("releasing the claims of %s failed", self.owner)
        self.registry.close()
        with self.state.lock:
            self.state.runs.clear()
            self.state.by_seq.clear()
        if all(not t.alive for t in self._threads):
            for wakeup in self._wakeups():
                wakeup.close()
        log.info("runtime %s stopped", self.owner)

    def abort(self) -> None:
        """Stop at once as if the process died: nothing more is committed, no claim is released.

        What is left is what a crash leaves: the tasks keep their state and
        their leases run out, so recovery (at start-up, or another worker's
        lease check) applies their restart policy.
        """
        self.state.aborted = True
        self.state.stopping = True
        self.state.ready = False
        _started.discard(self)
        self._wake_threads()
        for thread in self._threads:
            thread.join(10.0)
        self.registry.close()

    def _wakeups(self) -> list[Wakeup]:
        return [self.state.sched_wake, self.state.commit_wake, self.watcher.wake, self.janitor.wake, self.kvdisk.wake]

    def _wake_threads(self) -> None:
        for wakeup in self._wakeups():
            wakeup.set()

    # hints from the web layer
    def notify_cancel(self, task_id: str) -> None:
        """A cancel the store accepted: the task's sequence stops at the engine's next
        step when this worker runs it (otherwise the lease renewal finds it)."""
        with self.state.lock:
            run = self.state.runs.get(task_id)
            if run is not None:
                run.cancel = True
        if run is not None:
            run.cancel_sequence()
        self.waiters.notify([task_id])

    def commit_generation(self) -> int:
        """A number that changes with every commit this process announces (see wait_for_commit)."""
        return self.waiters.generation

    def metrics(self) -> dict[str, Any]:
        figures = self.stats.snapshot()
        with self.state.lock:
            runs = list(self.state.runs.values())
        figures["claimed_tasks"] = len(runs)
        figures["active_sequences"] = sum(1 for r in runs if r.seq is not None)
        figures["queue_depth"] = sum(1 for r in runs if r.seq is None)  # claimed here, not decoding yet
        figures["engine_slots"] = int(self.config.n_parallel)
        engines = self.registry.engines()
        figures["loaded_models"] = [model_id for model_id, _ in engines]
        steps, passes, fillers = {}, {}, {}
        for model_id, engine in engines:
            try:
                counts = engine.stats()
            except Exception:  # closed meanwhile, or an engine without counters
                continue
            steps[model_id] = counts.get("steps", 0)
            passes[model_id] = counts.get("ubatches", counts.get("steps", 0))
            fillers[model_id] = counts.get("filler_rows", 0)
        figures["engine_steps"] = steps
        figures["engine_ubatches"] = passes
        figures["engine_filler_rows"] = fillers
        figures.update(self.kvdisk.metrics())
        figures.update(self.registry.rpc.figures())
        figures["waiting_requests"] = self.waiters.waiting()
        figures["ready"] = self.state.ready
        return figures
