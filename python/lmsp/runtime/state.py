"""What the rooms of one worker's runtime share: its runs, the lock over them, and
the wake-ups of its threads.

A :class:`Run` is one task claimed in this process (or a sequence started for a
task being created). :class:`WorkerState` holds the runs by task and by engine
sequence, the flags of the worker's life (stopping, draining, aborted) and the
wake-ups of the scheduler and commit threads; the scheduler, the committer, the
watcher, the janitor and the model room each get the same one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ..contracts import ClaimRecord, EngineResult, EventRow
from ._threads import Wakeup, allocate_lock
from .metrics import Metrics
from .registry import ModelRegistry
from .waiters import CommitWaiters

log = logging.getLogger("lmsp.runtime")

IDLE_WAIT = 0.5  # seconds a thread's loop sleeps when nothing wakes it
MAX_BACKOFF = 2.0  # seconds between retries of what a busy store refused


@dataclass
class Run:
    """One claimed task in this process."""

    task_id: str
    model: str
    attempt: int = 0  # the task's attempts when claimed: its steps are for this attempt only
    engine: Any = None
    seq: int | None = None
    state: str = "queued"  # the task's state in the store as this worker set it
    cancel: bool = False  # a cancel arrived before the sequence existed
    tries: int = 0  # start attempts that met a transient error
    waits: int = 0  # start attempts the store could not take (it fails nothing)
    retry_at: float = 0.0
    failure: tuple[str, str] | None = None  # (code, message) once it must fail
    claimed_at: float = field(default_factory=time.monotonic)
    first_token: bool = False
    first_text: bool = False
    final: EngineResult | None = field(default=None, repr=False)  # the engine's last result
    tokens: list[int] | None = field(default=None, repr=False)  # the prompt, when its request rendered it
    # a sequence started before its task committed (Scheduler.start_early): its results
    # wait here until the task is adopted; None once they go to the store
    held: list[EngineResult] | None = field(default=None, repr=False)
    # its output as text or a function call, for a request with tools (toolcalls.CallShaper)
    calls: Any = field(default=None, repr=False)

    def key(self) -> tuple[int, int]:
        """The run's entry in :attr:`WorkerState.by_seq` (it must have a sequence)."""
        assert self.seq is not None
        return id(self.engine), self.seq

    def cancel_sequence(self) -> None:
        """Stop the run's sequence at the engine's next step, if it has one; an engine
        closed meanwhile runs nothing anyway."""
        if self.engine is None or self.seq is None:
            return
        try:
            self.engine.cancel(self.seq)
        except Exception as exc:  # closed meanwhile
            log.debug("cancel of sequence %s: %s", self.seq, exc)


class WorkerState:
    """The state the runtime's rooms share (see the module docstring).

    ``lock`` guards ``runs``, ``by_seq``, ``early``, ``released``, ``reserved`` and
    ``adopted``. ``committed`` is replaced entry by entry by the commit thread and
    read by the streams.
    """

    def __init__(self, config: Any, store: Any, registry: ModelRegistry) -> None:
        self.config = config
        self.store = store
        self.registry = registry
        self.waiters = CommitWaiters()
        self.stats = Metrics()
        self.owner = ""  # set at the start: host:pid:random
        self.lease = float(config.lease_seconds)
        self.lock = allocate_lock()
        self.runs: dict[str, Run] = {}  # task id -> its run here
        self.held: set[str] = set()  # tasks a request of this worker runs itself (embeddings)
        self.by_seq: dict[tuple[int, int], Run] = {}  # (id(engine), seq) -> the run of that sequence
        self.early: list[Run] = []  # sequences started for tasks being created
        self.released: list[Run] = []  # early runs adopted: their held results go to the committer
        self.reserved = 0  # slots promised to tasks being created
        self.adopted: list[tuple[Run, ClaimRecord]] = []  # tasks created claimed here, for the scheduler to start
        # task id -> (item_id, event rows) of its latest commit, for this worker's streams
        self.committed: dict[str, tuple[str, list[EventRow]]] = {}
        self.ready = False  # started, and not stopped
        self.stopping = False
        self.draining = False
        self.aborted = False
        self.claim_due = True  # the store may hold claimable tasks: the scheduler looks on its next round
        self.orphans_due = False  # an engine was closed under its runs: the committer ends them now
        self.sched_wake = Wakeup()
        self.commit_wake = Wakeup()
        self.kvdisk: Any = None  # the KV files (.kvdisk.KvDisk), set by the runtime

    def wake_scheduler(self) -> None:
        """Wake the scheduler to claim from the store (a task was queued or a slot came free)."""
        self.claim_due = True
        self.sched_wake.set()

    def forget(self, run: Run) -> None:
        """Take a run out of the tables (its task is no longer this worker's to run)."""
        with self.lock:
            if self.runs.get(run.task_id) is run:
                del self.runs[run.task_id]
                self.committed.pop(run.task_id, None)
            if run.seq is not None:
                self.by_seq.pop(run.key(), None)

    def slots_free(self) -> int:
        """Engine slots left for new claims and reservations (under the lock)."""
        return int(self.config.n_parallel) - len(self.runs) - self.reserved
