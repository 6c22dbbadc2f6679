"""The service's own history, written by the janitor thread once a minute.

At its first round in a new minute (it runs one every ``FILE_CHECK_SECONDS``),
the janitor writes this worker's row of the minute that ended
(:mod:`lmsp.store.history`): what the worker's figures (:mod:`.metrics`) counted
since the last row (tokens, tasks finished and failed, the time-to-first-token
histogram), the sequences it is decoding, and the bytes of the database and of
the KV files. Nothing is counted per token: the row is the difference of two
snapshots of the counters the worker keeps anyway. A write the store refuses
(busy) is tried again at the next round, its counts kept for it.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

from .metrics import TTFT_BUCKETS
from .state import WorkerState

log = logging.getLogger("lmsp.runtime")

MINUTE = 60


class HistoryWriter:
    """This worker's rows of the history (see the module docstring); ``clock``: the
    runtime's wall clock."""

    def __init__(self, state: WorkerState, clock: Callable[[], float]) -> None:
        self.state = state
        self.clock = clock
        self.minute = int(clock() // MINUTE)  # the minute the counts since ``last`` go to
        self.last = counters(state.stats.snapshot())

    def tick(self) -> bool:
        """Write the row of the minute that ended, once a new one began; True when written."""
        minute = int(self.clock() // MINUTE)
        if minute <= self.minute or not self.state.owner:
            return False
        now = counters(self.state.stats.snapshot())
        figures = difference(now, self.last)
        figures["running"] = self.running()
        figures["db_bytes"] = db_bytes(self.state.store.path)
        kvdisk = self.state.kvdisk
        figures["kv_bytes"] = int(kvdisk.held) if kvdisk is not None and kvdisk.enabled else None
        self.state.store.record_minute(self.state.owner, minute - 1, figures)
        self.minute, self.last = minute, now
        return True

    def running(self) -> int:
        with self.state.lock:
            return sum(1 for run in self.state.runs.values() if run.seq is not None)


def counters(snapshot: dict[str, Any]) -> dict[str, Any]:
    """What a row counts, out of a snapshot of the worker's figures."""
    finished = snapshot["tasks_finished"]
    ttft = snapshot["ttft_seconds"]
    return {
        "tokens": snapshot["tokens_generated"],
        "tasks_finished": sum(finished.values()),
        "errors": finished.get("error", 0),
        "ttft_buckets": [n for _, n in ttft["buckets"]],  # cumulative
        "ttft_count": ttft["count"],
    }


def difference(now: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """A row's counts: ``now`` less ``before``, the histogram as the store keeps it
    (pairs of an upper bound in ms and a count, the last one over every bound), or
    None when no first token came."""
    out = {name: now[name] - before[name] for name in ("tokens", "tasks_finished", "errors")}
    count = now["ttft_count"] - before["ttft_count"]
    if count <= 0:
        out["ttft"] = None
        return out
    cumulative = [a - b for a, b in zip(now["ttft_buckets"], before["ttft_buckets"])]
    pairs, below = [], 0
    for bound, total in zip(TTFT_BUCKETS, cumulative):
        pairs.append([round(bound * 1000.0, 3), total - below])
        below = total
    pairs.append([None, count - below])
    out["ttft"] = pairs
    return out


def db_bytes(path: Any) -> int | None:
    """The database file's bytes with its write-ahead log's; None when it cannot be read."""
    total = 0
    for suffix in ("", "-wal"):
        try:
            total += os.stat(f"{path}{suffix}").st_size
        except FileNotFoundError:
            continue
        except OSError:
            return None
    return total
