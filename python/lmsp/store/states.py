"""Task states, the transitions LMSP allows, and the start-up recovery table (11.3)."""

from __future__ import annotations

from ..errors import IllegalTransition

QUEUED, LOADING, RUNNING, CANCELLING = "queued", "loading", "running", "cancelling"
COMPLETED, FAILED, CANCELLED = "completed", "failed", "cancelled"

STATES = (QUEUED, LOADING, RUNNING, CANCELLING, COMPLETED, FAILED, CANCELLED)
UNFINISHED = frozenset({QUEUED, LOADING, RUNNING, CANCELLING})
FINISHED = frozenset({COMPLETED, FAILED, CANCELLED})
STARTED = (LOADING, RUNNING, CANCELLING)


def sql_list(states: tuple[str, ...]) -> str:
    """``states`` as an SQL list, for ``status IN (...)``."""
    return "(" + ",".join(f"'{state}'" for state in states) + ")"


UNFINISHED_SQL = sql_list((QUEUED, *STARTED))
STARTED_SQL = sql_list(STARTED)
POLICIES = ("fail", "retry", "resume")

# state -> the states it may move to. Self-loops are the recovery moves
# (queued -> queued on requeue, running -> running on resume).
TRANSITIONS: dict[str, frozenset[str]] = {
    QUEUED: frozenset({QUEUED, LOADING, RUNNING, CANCELLED, FAILED}),
    LOADING: frozenset({QUEUED, RUNNING, CANCELLED, FAILED}),
    RUNNING: frozenset({QUEUED, RUNNING, CANCELLING, COMPLETED, FAILED, CANCELLED}),
    # once a cancel is accepted the task can only end cancelled (B.7)
    CANCELLING: frozenset({CANCELLED}),
    COMPLETED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
}

# 11.3: (state found at start, on_restart) -> state the task moves to
RECOVERY: dict[tuple[str, str], str] = {
    (QUEUED, "fail"): FAILED,
    (QUEUED, "retry"): QUEUED,
    (QUEUED, "resume"): QUEUED,
    (LOADING, "fail"): FAILED,
    (LOADING, "retry"): QUEUED,
    (LOADING, "resume"): QUEUED,
    (RUNNING, "fail"): FAILED,
    (RUNNING, "retry"): QUEUED,
    (RUNNING, "resume"): RUNNING,
    (CANCELLING, "fail"): CANCELLED,
    (CANCELLING, "retry"): CANCELLED,
    (CANCELLING, "resume"): CANCELLED,
}


def check(task_id: str, current: str, target: str) -> None:
    """Raise :class:`IllegalTransition` unless ``current -> target`` is allowed."""
    if target not in TRANSITIONS.get(current, ()):
        raise IllegalTransition(task_id, current, target)


class ClaimLost(IllegalTransition):
    """The worker does not own the task (any more); nothing was changed."""

    def __init__(self, task_id: str, owner: str, holder: str | None) -> None:
        super().__init__(task_id, "claimed by " + (holder or "nobody"), "owned by " + owner)
        self.message = f"task {task_id} is not claimed by {owner}"
        self.args = (self.message,)
