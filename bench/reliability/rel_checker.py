"""The invariants of LMSP chapter 11, checked straight from the SQLite files.

A check reads the database with its own ``sqlite3`` connection, never through
the service, so a bug in the service's read path cannot hide a bug in its
write path. The few checks that need the client's view (what a 202 or a
stream said) take it as plain data.

    before = StoreView.load(copy_db(data_dir, tmp / "at-kill"))   # what the crash left
    ... restart the service ...
    after = StoreView.load(open_live(data_dir))
    violations = check_log(after) + check_recovery(before, after)

A :class:`Violation` names the invariant, the task and what was seen; a run
with none is the goal.
"""
from __future__ import annotations

import json
import shutil
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

__all__ = [
    "RECOVERY", "TERMINAL_EVENTS", "Task", "StoreView", "Violation",
    "check_acknowledged", "check_idempotency", "check_log", "check_recovery", "check_seen_events",
    "copy_db", "integrity", "open_copy", "open_live",
]

UNFINISHED = ("queued", "loading", "running", "cancelling")
FINISHED = ("completed", "failed", "cancelled")

# LMSP 11.3, written out again here from the contract (not imported from the
# service): (state found at start, on_restart) -> state after recovery.
RECOVERY = {
    ("queued", "fail"): "failed", ("queued", "retry"): "queued", ("queued", "resume"): "queued",
    ("loading", "fail"): "failed", ("loading", "retry"): "queued", ("loading", "resume"): "queued",
    ("running", "fail"): "failed", ("running", "retry"): "queued", ("running", "resume"): "running",
    ("cancelling", "fail"): "cancelled", ("cancelling", "retry"): "cancelled",
    ("cancelling", "resume"): "cancelled",
}
# LMSP B.12: a task found started (loading or running, held by a worker) is started
# again at most max_attempts times in all; the restart past that fails it with this code,
# whatever its policy. A task found waiting (queued, or running and held by nobody) keeps
# its count. The service's default of max_attempts:
MAX_ATTEMPTS = 3
EXHAUSTED = "attempts_exhausted"
# the event the recovery transaction writes for a state change
RECOVERY_EVENT = {"failed": "response.failed", "cancelled": "response.cancelled"}
TERMINAL_EVENTS = {
    "response.completed": ("completed",), "response.incomplete": ("completed",),
    "response.failed": ("failed",), "response.cancelled": ("cancelled",),
}
DELTA = "response.output_text.delta"


@dataclass(frozen=True)
class Violation:
    kind: str
    task_id: str | None
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.task_id or '-'}: {self.detail}"


@dataclass
class Event:
    seq: int
    type: str
    text: str | None
    data: dict

    def key(self) -> tuple:
        """What must never change once committed."""
        return (self.seq, self.type, self.text)


@dataclass
class Task:
    id: str
    response_id: str
    status: str
    on_restart: str
    attempts: int
    last_seq: int
    error: dict | None
    output_text: str | None
    incomplete_reason: str | None
    request: dict
    events: list[Event] = field(default_factory=list)
    owner: str | None = None

    @property
    def started(self) -> bool:
        """A worker held it started: its restart counts one of its attempts (B.12)."""
        return self.status in ("loading", "running") and self.owner is not None

    @property
    def soak_key(self) -> str | None:
        meta = self.request.get("metadata") if isinstance(self.request, dict) else None
        return meta.get("soak") if isinstance(meta, dict) else None

    def expected_text(self) -> str:
        """The deltas after the last ``task.requeued`` event, concatenated (B.6)."""
        start = 0
        for i, ev in enumerate(self.events):
            if ev.type == "task.requeued":
                start = i + 1
        return "".join(ev.text or "" for ev in self.events[start:] if ev.type == DELTA)


# -------------------------------------------------------------------- files

def copy_db(data_dir: Path, dest: Path) -> Path:
    """Copy the database and its WAL as a crash left them (never the -shm
    index, which SQLite rebuilds) and return the copied database path."""
    dest.mkdir(parents=True, exist_ok=True)
    src = Path(data_dir) / "lmsp.db"
    shutil.copyfile(src, dest / "lmsp.db")
    wal = src.with_name("lmsp.db-wal")
    if wal.exists():
        shutil.copyfile(wal, dest / "lmsp.db-wal")
    return dest / "lmsp.db"


def open_copy(path: Path) -> sqlite3.Connection:
    """A connection to a private copy (it may recover the WAL into it)."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.row_factory = sqlite3.Row
    return conn


def open_live(data_dir: Path) -> sqlite3.Connection:
    """A read-only connection to the database of a running service."""
    path = Path(data_dir) / "lmsp.db"
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, timeout=30)
    conn.row_factory = sqlite3.Row
    return conn


def integrity(conn: sqlite3.Connection) -> list[Violation]:
    out = []
    rows = [r[0] for r in conn.execute("PRAGMA integrity_check")]
    if rows != ["ok"]:
        out.append(Violation("integrity_check", None, "; ".join(rows[:5])))
    bad = list(conn.execute("PRAGMA foreign_key_check"))
    if bad:
        out.append(Violation("foreign_key_check", None, f"{len(bad)} rows, first {tuple(bad[0])}"))
    return out


# --------------------------------------------------------------------- view

@dataclass
class StoreView:
    tasks: dict[str, Task]
    responses: dict[str, str]          # response id -> task id

    @classmethod
    def load(cls, conn: sqlite3.Connection, task_ids: Iterable[str] | None = None) -> "StoreView":
        """Read tasks with their responses and events in one read transaction."""
        conn.row_factory = sqlite3.Row
        conn.execute("BEGIN")
        try:
            where, args = "", ()
            if task_ids is not None:
                ids = list(task_ids)
                where = f" WHERE t.id IN ({','.join('?' * len(ids))})" if ids else " WHERE 0"
                args = tuple(ids)
            tasks: dict[str, Task] = {}
            for r in conn.execute(
                    "SELECT t.id, t.response_id, t.status, t.on_restart, t.attempts, t.error, t.owner,"
                    " coalesce((SELECT max(seq) FROM task_events e WHERE e.task_id = t.id), 0) AS last_seq,"
                    " r.output_text, r.incomplete_reason, r.request FROM tasks t"
                    " JOIN responses r ON r.id = t.response_id" + where, args):
                tasks[r["id"]] = Task(
                    r["id"], r["response_id"], r["status"], r["on_restart"], r["attempts"], r["last_seq"],
                    _json(r["error"]), r["output_text"], r["incomplete_reason"], _json(r["request"]) or {},
                    owner=r["owner"])
            ev_where = where.replace("t.id", "task_id")
            for r in conn.execute("SELECT task_id, seq, type, text, data FROM task_events" + ev_where
                                  + " ORDER BY task_id, seq", args):
                task = tasks.get(r["task_id"])
                if task is not None:
                    task.events.append(Event(r["seq"], r["type"], r["text"], _json(r["data"]) or {}))
        finally:
            conn.execute("COMMIT")
        return cls(tasks, {t.response_id: t.id for t in tasks.values()})

    def n_events(self) -> int:
        return sum(len(t.events) for t in self.tasks.values())

    def by_response(self, response_id: str) -> Task | None:
        tid = self.responses.get(response_id)
        return None if tid is None else self.tasks[tid]


def _json(text):
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return {"unparsable": text}


# ------------------------------------------------------------------- checks

def check_log(view: StoreView) -> list[Violation]:
    """Per task: a gapless log that agrees with the task row, one terminal event
    at the end of a finished task only, the output text equal to its deltas,
    and an accepted cancel never followed by completion."""
    out: list[Violation] = []
    for t in view.tasks.values():
        seqs = [e.seq for e in t.events]
        if seqs != list(range(1, len(seqs) + 1)):
            gap = next((i + 1 for i, s in enumerate(seqs) if s != i + 1), None)
            out.append(Violation("gap", t.id, f"sequence numbers {seqs[:3]}...{seqs[-3:]} break at {gap}"))
        terminal = [i for i, e in enumerate(t.events) if e.type in TERMINAL_EVENTS]
        if t.status in FINISHED:
            if len(terminal) != 1 or terminal[0] != len(t.events) - 1:
                out.append(Violation("terminal", t.id, f"{t.status} task has terminal events at {terminal} "
                                     f"of {len(t.events)}"))
            elif t.status not in TERMINAL_EVENTS[t.events[-1].type]:
                out.append(Violation("terminal", t.id, f"{t.status} task ends with {t.events[-1].type}"))
            expected = t.expected_text()
            if t.status == "completed" and (t.output_text or "") != expected:
                out.append(Violation("text", t.id, f"output {t.output_text!r:.80} != deltas {expected!r:.80}"))
            elif t.output_text is not None and t.output_text != expected:
                out.append(Violation("text", t.id, f"{t.status}: output {t.output_text!r:.80} != deltas "
                                     f"{expected!r:.80}"))
            kinds = [e.type for e in t.events]
            if "task.requeued" in kinds:  # the last attempt's output
                kinds = kinds[len(kinds) - kinds[::-1].index("task.requeued"):]
            if kinds.count("response.output_item.added") != kinds.count("response.output_item.done"):
                out.append(Violation("item_open", t.id, f"{t.status} task left its output item open"))
            if t.status == "failed" and t.events[-1].type == "response.failed":
                out.extend(_check_failed_event(t))
        elif terminal:
            out.append(Violation("terminal", t.id, f"unfinished ({t.status}) task has a terminal event"))
        types = [e.type for e in t.events]
        if "task.cancelling" in types:
            after = types[types.index("task.cancelling"):]
            if "response.completed" in after or "response.incomplete" in after or t.status == "completed":
                out.append(Violation("cancel_atomic", t.id, "completed after an accepted cancel"))
    return out


def _check_failed_event(t: Task) -> list[Violation]:
    """B.6: a response.failed carries the task's error in ``response.error``, and no
    top-level ``error`` (which the openai package takes for a failed stream)."""
    data = t.events[-1].data
    error = (data.get("response") or {}).get("error")
    if "error" in data:
        return [Violation("failed_error", t.id, f"response.failed has a top-level error {data['error']}")]
    if not isinstance(error, dict) or error.get("code") != (t.error or {}).get("code"):
        return [Violation("failed_error", t.id, f"response.failed has response.error {error}, "
                          f"the task {t.error}")]
    return []


# what ends an open output item, in the transaction that ends its task, before the terminal event
ITEM_CLOSING = ("response.output_text.done", "response.content_part.done", "response.output_item.done")


def check_recovery(before: StoreView, after: StoreView, max_attempts: int = MAX_ATTEMPTS) -> list[Violation]:
    """What the service found at start (``before``, read from a copy of the
    files the crash left) against what it made of it (``after``): table 11.3,
    within the ``max_attempts`` starts of B.12."""
    out: list[Violation] = []
    for t in before.tasks.values():
        a = after.tasks.get(t.id)
        if a is None:
            out.append(Violation("lost", t.id, f"task ({t.status}) vanished after the restart"))
            continue
        old = [e.key() for e in t.events]
        new = [e.key() for e in a.events[:len(old)]]
        if new != old:
            at = next((i for i, (x, y) in enumerate(zip(old, new)) if x != y), min(len(old), len(new)))
            out.append(Violation("rewritten", t.id, f"committed event {at + 1} changed: "
                                 f"{old[at] if at < len(old) else None} -> {new[at] if at < len(new) else None}"))
            continue
        if t.status in FINISHED:
            if a.status != t.status or a.last_seq != t.last_seq:
                out.append(Violation("finished_changed", t.id, f"{t.status}/{t.last_seq} became "
                                     f"{a.status}/{a.last_seq}"))
            continue
        target = RECOVERY[(t.status, t.on_restart)]
        exhausted = t.started and t.attempts >= max_attempts
        if exhausted:
            target = "failed"
        expected_attempts = t.attempts + int(t.started)
        nxt = a.events[len(t.events)] if len(a.events) > len(t.events) else None
        nxt_type = nxt.type if nxt else None
        where = f"{t.status}+{t.on_restart}"
        if target in ("failed", "cancelled"):
            later = [e.type for e in a.events[len(t.events):]]
            if later[:len(ITEM_CLOSING)] == list(ITEM_CLOSING):  # the open output item closed first
                nxt_type = later[len(ITEM_CLOSING)] if len(later) > len(ITEM_CLOSING) else None
            if a.status != target:
                out.append(Violation("recovery_state", t.id, f"{where}: became {a.status}, 11.3 says {target}"))
            if nxt_type != RECOVERY_EVENT[target]:
                out.append(Violation("recovery_event", t.id, f"{where}: next event {nxt_type}, "
                                     f"expected {RECOVERY_EVENT[target]}"))
            code = EXHAUSTED if exhausted else "server_restarted"
            if target == "failed" and (a.error or {}).get("code") != code:
                out.append(Violation("recovery_error", t.id, f"{where}: error {a.error}, expected {code}"))
        elif a.attempts != expected_attempts:  # only a start counts (B.12)
            out.append(Violation("attempts", t.id, f"{where}: attempts {t.attempts} became {a.attempts}, "
                                 f"expected {expected_attempts}"))
        elif (t.status, target) in (("running", "queued"), ("loading", "queued")):
            if nxt_type != "task.requeued":
                out.append(Violation("recovery_event", t.id, f"{where}: next event {nxt_type}, expected task.requeued"))
        elif (t.status, target) == ("running", "running"):
            if nxt_type != "task.resumed":
                out.append(Violation("recovery_event", t.id, f"{where}: next event {nxt_type}, expected task.resumed"))
        else:  # queued stays queued: at most a task.requeued, then the ordinary progress
            if nxt_type in ("response.failed", "task.resumed"):
                out.append(Violation("recovery_event", t.id, f"{where}: next event {nxt_type}"))
        if t.on_restart != "fail" and t.status != "cancelling" and a.status == "failed" \
                and (a.error or {}).get("code") == "server_restarted":
            out.append(Violation("recovery_state", t.id, f"{where}: failed with server_restarted"))
    return out


def check_acknowledged(acknowledged: Iterable[str], view: StoreView, when: str) -> list[Violation]:
    """Every response that a client saw acknowledged (202, or ``response.created``
    on a stream) exists in the store."""
    return [Violation("unacknowledged_loss", rid, f"acknowledged but missing {when}")
            for rid in acknowledged if rid not in view.responses]


def check_idempotency(keys: Iterable[str], view: StoreView) -> list[Violation]:
    """No idempotency key (carried in ``metadata.soak``) produced two tasks."""
    wanted = set(keys)
    counts = Counter(t.soak_key for t in view.tasks.values() if t.soak_key in wanted)
    return [Violation("duplicate", None, f"key {k} made {n} tasks") for k, n in counts.items() if n > 1]


def check_seen_events(response_id: str, seen: list[dict], view: StoreView) -> list[Violation]:
    """Events that a stream showed are the committed ones, unchanged."""
    t = view.by_response(response_id)
    if t is None:
        return [Violation("stream_phantom", response_id, "a stream showed a response the store lacks")]
    by_seq = {e.seq: e for e in t.events}
    out = []
    for ev in seen:
        seq = ev.get("sequence_number")
        stored = by_seq.get(seq)
        if stored is None:
            out.append(Violation("stream_phantom", t.id, f"streamed event {seq} ({ev.get('type')}) is not stored"))
        elif stored.type != ev.get("type") or (stored.type == DELTA and stored.text != ev.get("delta")):
            out.append(Violation("stream_mismatch", t.id, f"event {seq}: streamed {ev.get('type')} "
                                 f"{ev.get('delta')!r}, stored {stored.type} {stored.text!r}"))
    return out
