"""The rows an engine step writes, worked out from the tasks' step states alone.

Nothing here touches the database: :mod:`lmsp.store.steps` writes what these
functions make. A task's :class:`~lmsp.contracts.StepState` is where its last
committed step left it; an item turns it into event rows and a new state:

* :func:`usual_step`: the usual step, in which every item adds one more delta
  to its task's open output item, in one pass (or None for any other step);
* :func:`known_step`: any step of tasks whose states are known, with the
  guarded updates of the task rows that change;
* :func:`step_rows`: the general turn of items into rows, which both of the
  above and the database path share.
"""

from __future__ import annotations

from functools import partial
from typing import Iterable, NamedTuple

from .. import calls
from .. import objects as obj
from ..contracts import EventRow, StepItem, StepState
from .base import CALL_OPEN, CHAT_OPEN, dumps

DELTA = "response.output_text.delta"
ARGS_DELTA = "response.function_call_arguments.delta"
FINISHES = (None, "stop", "length", "cancelled", "error")

#: a task_events row to insert: ``(task_id, seq, type, created_at, text, tokens, data)``
EventInsert = tuple[str, int, str, float, str | None, str | None, str | None]
# a StepState made from a plain tuple, without NamedTuple's Python-level __new__ (at
# twice a tuple's cost, not four times): the step path makes one per task per step
_as_state = partial(tuple.__new__, StepState)

#: a guarded task row update: ``(item_open, pending_tokens, kv_path, task_id, owner, last_seq before the step)``
RowUpdate = tuple[int, str, str | None, str, str, int]


class StepPlan(NamedTuple):
    """What a step of known tasks writes, made before the write lock."""

    states: dict[str, StepState | None]  # the state each task is left in (None: forget it)
    events: list[EventInsert]
    updates: list[RowUpdate]  # the tasks whose row changes (item_open, pending_tokens or kv_path)


class StepEnd(NamedTuple):
    """An item that ends its task, with the state the task reached before its end."""

    task_id: str
    item: StepItem
    state: StepState


def tokens_text(tokens: Iterable[int] | None) -> str:
    """Token ids as stored: comma separated, "" for none."""
    if not tokens:
        return ""
    return ",".join(map(str, map(int, tokens)))


def delta_data(item: StepItem) -> str | None:
    """The ``data`` of a delta row: None, or the log probabilities of its tokens
    (``{"logprobs": [...]}``) for a task that asked for them."""
    logprobs = item.get("logprobs")
    return dumps({"logprobs": logprobs}) if logprobs else None


def usual_step(owner: str, items: list[StepItem], cache: dict[str, StepState], now: float) -> StepPlan | None:
    """The usual step in one pass, when every item is one task's next text delta (the
    task last written by this process as ``owner``, its item open, no tokens held
    back, not finishing, no KV file, not twice in the step). None for any other step."""
    events: list[EventInsert] = []
    states: dict[str, StepState | None] = {}
    append = events.append
    for item in items:
        tid = item["task_id"]
        state = cache.get(tid)
        if state is None or tid in states or item.get("finish") is not None or item.get("kv_path") or "calls" in item:
            return None
        held_by, last_seq, item_open, pending, kv_path, item_id = state
        delta = item.get("delta")
        if held_by != owner or not item_open or pending or not delta:
            return None
        tokens = item.get("tokens")
        toks = str(int(tokens[0])) if tokens and len(tokens) == 1 else tokens_text(tokens)
        seq = last_seq + 1
        append((tid, seq, DELTA, now, delta, toks, delta_data(item)))
        states[tid] = _as_state((owner, seq, 1, "", kv_path, item_id))
    return StepPlan(states, events, [])


def split_known(
    owner: str, items: list[StepItem], cache: dict[str, StepState]
) -> tuple[dict[str, StepState], list[StepItem], list[StepItem]]:
    """The states of the tasks this process last wrote as ``owner`` whose items do not
    end them, taken once (other threads may update the cache meanwhile), with their
    items; then the other items (a task new to this process, one that ends)."""
    known: dict[str, StepState] = {}
    checked: set[str] = set()
    for item in items:
        tid = item["task_id"]
        finish = item.get("finish")
        if finish is not None:
            if finish not in FINISHES:
                raise ValueError(f"unknown finish {finish!r}")
            checked.add(tid)
        elif tid not in checked and tid not in known:
            state = cache.get(tid)
            if state is not None and state.owner == owner:
                known[tid] = state
            else:
                checked.add(tid)
    for tid in checked:
        known.pop(tid, None)
    return (
        known,
        [item for item in items if item["task_id"] in known],
        [item for item in items if item["task_id"] not in known],
    )


def known_step(owner: str, items: list[StepItem], known: dict[str, StepState], now: float) -> StepPlan:
    """The writes of a step of known tasks, none of which ends, with a guarded update
    for each task whose row changes."""
    events: list[EventInsert] = []
    states = step_rows(owner, items, known, now, events, [], [])
    updates: list[RowUpdate] = []
    for tid, new in states.items():
        old = known[tid]
        if new is not None and (
            new.item_open != old.item_open or new.pending_tokens != old.pending_tokens or new.kv_path != old.kv_path
        ):
            updates.append((new.item_open, new.pending_tokens, new.kv_path, tid, owner, old.last_seq))
    return StepPlan(states, events, updates)


def _open_item(events: list[EventInsert], tid: str, seq: int, item_id: str, now: float) -> int:
    """The two events that open a task's output item after event ``seq``; returns the last number."""
    events.append(
        (
            tid,
            seq + 1,
            "response.output_item.added",
            now,
            None,
            None,
            dumps({"output_index": 0, "item": obj.output_item(item_id, "in_progress", None)}),
        )
    )
    events.append(
        (
            tid,
            seq + 2,
            "response.content_part.added",
            now,
            None,
            None,
            dumps({"item_id": item_id, "output_index": 0, "content_index": 0, "part": obj.output_part("")}),
        )
    )
    return seq + 2


def _call_row(tid: str, seq: int, item_id: str, now: float, segment: dict) -> list[EventInsert]:
    """The rows of one segment of calls (:class:`~lmsp.contracts.StepItem`) after event
    ``seq``: the call's opening (which keeps its head, the text up to the arguments),
    its arguments' delta, and, where it is done before the next call, its arguments'
    done event (which keeps its tail) and its item's done event."""
    index = segment["index"]
    fc_id = calls.ids(item_id, index)[0]
    rows: list[EventInsert] = []
    call = segment.get("call")
    if call is not None:
        item = calls.call_item(item_id, call["name"], "", "in_progress", index)
        rows.append((tid, seq + 1, "response.output_item.added", now, call["head"], None,
                     dumps({"output_index": index, "item": item})))  # fmt: skip
    args = segment.get("args") or ""
    if args:
        data = dumps({"item_id": fc_id, "output_index": index, "delta": args})
        rows.append((tid, seq + len(rows) + 1, ARGS_DELTA, now, args, None, data))
    done = segment.get("done")
    if done is not None:
        data = dumps({"item_id": fc_id, "output_index": index, "arguments": done["arguments"]})
        rows.append((tid, seq + len(rows) + 1, "response.function_call_arguments.done", now, done["tail"], None, data))
        item = calls.call_item(item_id, done["name"], done["arguments"], "completed", index)
        data = dumps({"output_index": index, "item": item})
        rows.append((tid, seq + len(rows) + 1, "response.output_item.done", now, None, None, data))
    return rows


def _call_rows(
    events: list[EventInsert],
    tid: str,
    item: StepItem,
    seq: int,
    item_open: int,
    pending: str,
    toks: str,
    now: float,
    item_id: str,
) -> tuple[int, int, str]:
    """The function calls' rows of one step (:func:`_call_row`), the step's tokens (with
    those held back) on its last row with text; ``(seq, item_open, pending)``."""
    toks = pending + "," + toks if pending and toks else pending or toks
    last_text = -1
    for segment in item.get("calls") or ():
        for row in _call_row(tid, seq, item_id, now, segment):
            events.append(row)
            seq = row[1]
            if row[4]:
                last_text = len(events) - 1
        item_open = CALL_OPEN
    if last_text < 0 or not toks:
        return seq, item_open, toks
    row = events[last_text]
    events[last_text] = (*row[:5], toks, row[6])
    return seq, item_open, ""


def _text_rows(
    events: list[EventInsert],
    tid: str,
    item: StepItem,
    seq: int,
    item_open: int,
    pending: str,
    toks: str,
    now: float,
    item_id: str,
) -> tuple[int, int, str]:
    """A message item's rows of one step: its opening, its text delta (with the tokens
    held back before it); ``(seq, item_open, pending)``. An output on the chat layer
    has its own (:func:`_chat_rows`)."""
    if "rows" in item:
        seq, pending = _chat_rows(events, tid, item, seq, pending, toks, now)
        return seq, item.get("mark") or CHAT_OPEN, pending
    delta = item.get("delta")
    finish = item.get("finish")
    if not item_open and (delta or finish == "stop" or finish == "length"):
        seq = _open_item(events, tid, seq, item_id, now)
        item_open = 1
    if delta:
        seq += 1
        if pending:
            toks = pending + "," + toks if toks else pending
            pending = ""
        events.append((tid, seq, DELTA, now, delta, toks, delta_data(item)))
    elif toks:
        pending = pending + "," + toks if pending else toks
    return seq, item_open, pending


def _chat_rows(
    events: list[EventInsert], tid: str, item: StepItem, seq: int, pending: str, toks: str, now: float
) -> tuple[int, str]:
    """The chat layer's rows of one step (:mod:`lmsp.items.chat`): each event with its
    whole payload, the raw text on the rows that consumed it, the step's tokens (with
    those held back) on the last of those, its ``held_tokens`` held back;
    ``(seq, pending)``."""
    toks = pending + "," + toks if pending and toks else pending or toks
    held = tokens_text(item.get("held_tokens"))
    last_text = None
    for etype, raw, payload in item.get("rows") or ():
        seq += 1
        if raw is not None:
            last_text = len(events)
        events.append((tid, seq, etype, now, raw, None, dumps(payload)))
    if last_text is None:
        return seq, toks + "," + held if toks and held else toks or held
    if toks:
        row = events[last_text]
        events[last_text] = (*row[:5], toks, row[6])
    return seq, held


def step_rows(
    owner: str,
    items: list[StepItem],
    known: dict[str, StepState],
    now: float,
    events: list[EventInsert],
    ends: list[StepEnd],
    skipped: list[str],
) -> dict[str, StepState | None]:
    """Turn items into event rows (appended to ``events``); return the states they leave.

    ``known`` maps a task id to its state before the step; a task not in it is
    skipped (added to ``skipped``); an item that ends its task goes to ``ends``
    and leaves None (its final events come later).
    """
    made: dict[str, tuple | None] = {}  # plain tuples until the end: a task may have several items
    for item in items:
        tid = item["task_id"]
        state = made[tid] if tid in made else known.get(tid)
        if state is None:
            skipped.append(tid)
            continue
        _, seq, item_open, pending, kv_path, item_id = state
        finish = item.get("finish")
        tokens = item.get("tokens")
        # the usual step: one token per task
        toks = str(int(tokens[0])) if tokens and len(tokens) == 1 else tokens_text(tokens)
        if "calls" in item:  # function calls' output
            seq, item_open, pending = _call_rows(events, tid, item, seq, item_open, pending, toks, now, item_id)
        else:
            seq, item_open, pending = _text_rows(events, tid, item, seq, item_open, pending, toks, now, item_id)
        kv_path = item.get("kv_path") or kv_path
        if finish is not None:
            ends.append(StepEnd(tid, item, StepState(owner, seq, item_open, pending, kv_path, item_id)))
            made[tid] = None
        else:
            made[tid] = (owner, seq, item_open, pending, kv_path, item_id)
    return {tid: None if made_state is None else _as_state(made_state) for tid, made_state in made.items()}


def events_by_task(
    rows: list[EventInsert], states: dict[str, StepState | None]
) -> dict[str, tuple[str, list[EventRow]]]:
    """The event rows of the tasks left running, per task: ``(item_id, [EventRow])``.
    A task that ended is left out: its last events are written with its end."""
    out: dict[str, tuple[str, list[EventRow]]] = {}
    for tid, seq, etype, created_at, text, _, data in rows:
        entry = out.get(tid)
        if entry is None:
            state = states.get(tid)
            if state is None:
                continue
            entry = out[tid] = (state.item_id, [])
        entry[1].append((seq, etype, created_at, text, data))
    return out
