"""Named types that one layer hands another.

Each type here is part of a contract between two layers, so that both sides
name the same fields. The module imports nothing from the api, the runtime or
the native extension, and any layer may import it.

The store's side (:mod:`lmsp.store`):

* :class:`StepItem`: one task's part of an engine step, as the runtime hands
  it to ``Store.append_step``;
* :class:`StepState`: where ``append_step`` continues a task from;
* :data:`EventRow` (fields :data:`EVENT_ROW_FIELDS`): an event as the store
  writes and reads it;
* :class:`StepOutcome`: what ``append_step`` returns;
* :class:`ClaimRecord` (with :class:`Resume`): what a worker gets for each task
  it claims.
"""

from __future__ import annotations

from typing import Any, NamedTuple, NotRequired, Required, TypedDict


class StepItem(TypedDict, total=False):
    """One task's output in one engine step; only ``task_id`` is required.

    ``delta``: the text it adds; ``tokens``: the token ids of the step (a token
    without text is held back until text follows); ``finish``: None, or how the
    task ends (``stop``, ``length``, ``cancelled``, ``error``), with ``error``
    (``{"code", "message"}``) and ``usage`` for the final Response;
    ``kv_path``: the task's latest KV snapshot; ``attempt``: the task's
    ``attempts`` in the claim that made the output (an item of an earlier
    claim is skipped).
    """

    task_id: Required[str]
    delta: str
    tokens: list[int]
    finish: str | None
    error: dict[str, Any] | None
    usage: dict[str, Any] | None
    kv_path: str | None
    attempt: int


class StepState(NamedTuple):
    """A running task as its last committed step left it, which is what the next
    step continues from."""

    owner: str
    last_seq: int  # the number of its last event
    item_open: int  # 1 while its output item is open (added, not yet done)
    pending_tokens: str  # token ids held back until text follows, comma separated
    kv_path: str | None
    item_id: str  # the id of its output item


#: the fields of an :data:`EventRow`, in order
EVENT_ROW_FIELDS = ("seq", "type", "created_at", "text", "data")
#: ``(seq, type, created_at, text, data)``: ``text`` for a delta, ``data`` (JSON) for every other event
EventRow = tuple[int, str, float, str | None, str | None]


class StepOutcome(TypedDict):
    """What ``append_step`` did: the tasks it skipped (not this owner's, not
    running, or output of an earlier claim), those that ended cancelled, and
    the final state of each task that ended. ``events`` only when asked for:
    per task still running, ``(item_id, rows)``, every event the step wrote
    for it, in order."""

    skipped: list[str]
    cancelled: list[str]
    finished: dict[str, str]
    events: NotRequired[dict[str, tuple[str, list[EventRow]]]]


class Resume(TypedDict):
    """Where a resumed task's output stands: the tokens generated, the text
    emitted, and its KV snapshot (None if it has none)."""

    generated: list[int]
    emitted: str
    kv_path: str | None


class ClaimRecord(TypedDict):
    """What a worker needs to run a task it claimed; ``status`` is the state it
    was claimed in, ``resume`` is set for a task that continues (``running``)."""

    task_id: str
    response_id: str
    model: str
    request: dict[str, Any]
    status: str
    on_restart: str
    attempts: int
    item_id: str
    resume: Resume | None
    client_id: str | None
