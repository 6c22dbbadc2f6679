"""The output items of a task whose output the model's own chat format splits
(llama.cpp's chat layer: reasoning, text, function calls; docs/API.md,
"Reasoning" and "Function tools").

Such an output can make several items: a ``reasoning`` item, a ``message``
and ``function_call`` items, at output indexes 0, 1, ... in the order they
open. Each of its events keeps its whole payload in the event row's
``data`` (an ``output_text.delta`` too), and the row's ``text`` keeps the
model's raw output that the event's step consumed, so that the rows'
texts, concatenated, are the output as the model wrote it (what a resume
continues from). :func:`fold` makes the items back from the payloads.

It imports nothing of the service: the runtime and the store use it.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

ADDED = "response.output_item.added"
ITEM_DONE = "response.output_item.done"
PART_ADDED = "response.content_part.added"
PART_DONE = "response.content_part.done"
TEXT_DELTA = "response.output_text.delta"
TEXT_DONE = "response.output_text.done"
REASONING_DELTA = "response.reasoning.delta"
REASONING_DONE = "response.reasoning.done"
ARGS_DELTA = "response.function_call_arguments.delta"
ARGS_DONE = "response.function_call_arguments.done"


# an item's status in a Response of each status, while the item is not done
ITEM_STATUS = {"completed": "completed", "incomplete": "incomplete", "failed": "incomplete", "cancelled": "incomplete"}


def item_ids(response_item_id: str, kind: str, index: int, call_index: int) -> tuple[str, str | None]:
    """An item's id (and a call's ``call_id``), from the response's item id: the first
    message keeps it, the others take its suffix with their own prefix (and, past the
    first of their kind, their output index)."""
    suffix = response_item_id.split("_", 1)[-1]
    if kind == "message":
        return (response_item_id if index == 0 else f"msg_{suffix}_{index}"), None
    if kind == "reasoning":
        return (f"rs_{suffix}" if index == 0 else f"rs_{suffix}_{index}"), None
    tail = "" if call_index == 0 else f"_{call_index}"
    return f"fc_{suffix}{tail}", f"call_{suffix}{tail}"


def text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": list(logprobs or ())}


def new_item(kind: str, item_id: str, call_id: str | None = None, name: str = "") -> dict[str, Any]:
    """An item as ``output_item.added`` shows it."""
    if kind == "reasoning":
        return {"type": "reasoning", "id": item_id, "summary": [], "content": []}
    if kind == "message":
        return {"type": "message", "id": item_id, "role": "assistant", "status": "in_progress", "content": []}
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": "",
        "status": "in_progress",
    }


def done_item(
    item: dict[str, Any], body: str, status: str, logprobs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The item with its whole ``body`` (reasoning text, message text, arguments) and,
    for a message, the log probabilities of its text's tokens."""
    out = dict(item)
    if item["type"] == "reasoning":
        out["content"] = [{"type": "reasoning_text", "text": body}]
        return out
    out["status"] = status
    if item["type"] == "message":
        out["content"] = [text_part(body, logprobs)]
    else:
        out["arguments"] = body
    return out


def fold(events: Iterable[tuple[str, str | None]], status: str) -> list[dict[str, Any]]:
    """The output items that ``(type, data)`` event rows make, in output order; an item
    not done yet gets ``status`` (a reasoning item none) and its body so far."""
    items: list[dict[str, Any]] = []
    bodies: list[str] = []
    logprobs: list[list[dict[str, Any]]] = []
    closed: list[bool] = []
    for etype, data in events:
        if data is None:
            continue
        payload = json.loads(data)
        index = payload.get("output_index")
        if etype == ADDED and index == len(items):
            items.append(payload["item"])
            bodies.append("")
            logprobs.append([])
            closed.append(False)
        elif not isinstance(index, int) or not 0 <= index < len(items):
            continue
        elif etype in (TEXT_DELTA, REASONING_DELTA, ARGS_DELTA):
            bodies[index] += payload.get("delta") or ""
            logprobs[index] += payload.get("logprobs") or ()
        elif etype == ITEM_DONE:
            items[index] = payload["item"]
            closed[index] = True
    return [item if closed[i] else done_item(item, bodies[i], status, logprobs[i]) for i, item in enumerate(items)]


def closing_events(
    item: dict[str, Any], index: int, body: str, status: str, logprobs: list[dict[str, Any]] | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """The events that end an open item: ``(type, payload)``, in order; ``logprobs``: a
    message's, those of its deltas."""
    item_id = item["id"]
    done = done_item(item, body, status, logprobs)
    if item["type"] == "reasoning":
        ends = [(REASONING_DONE, {"item_id": item_id, "output_index": index, "content_index": 0, "text": body})]
    elif item["type"] == "message":
        base = {"item_id": item_id, "output_index": index, "content_index": 0}
        ends = [
            (TEXT_DONE, {**base, "text": body, "logprobs": list(logprobs or ())}),
            (PART_DONE, {**base, "part": text_part(body, logprobs)}),
        ]
    else:
        ends = [(ARGS_DONE, {"item_id": item_id, "output_index": index, "arguments": body})]
    return [*ends, (ITEM_DONE, {"output_index": index, "item": done})]


OpenItem = tuple[int, dict[str, Any], str, list[dict[str, Any]]]


def open_items(events: Iterable[tuple[str, str | None]]) -> list[OpenItem]:
    """The items the rows opened and did not end: ``(output index, item, body so far,
    log probabilities so far)``."""
    added: dict[int, tuple[dict[str, Any], str, list[dict[str, Any]]]] = {}
    for etype, data in events:
        if data is None:
            continue
        payload = json.loads(data)
        index = payload.get("output_index")
        if etype == ADDED:
            added[index] = (payload["item"], "", [])
        elif etype == ITEM_DONE:
            added.pop(index, None)
        elif etype in (TEXT_DELTA, REASONING_DELTA, ARGS_DELTA) and index in added:
            item, body, logprobs = added[index]
            added[index] = (item, body + (payload.get("delta") or ""), logprobs + (payload.get("logprobs") or []))
    return [(i, item, body, logprobs) for i, (item, body, logprobs) in sorted(added.items())]
