"""Items as a response's ``input_items`` and a conversation's items list them
(LMSP B.11): each with its id (``msg_``, ``fc_``, ``fco_``, ``rs_``), a type and
a status, message content as parts.

The API makes them from a request's checked ``input`` (:func:`input_items`) and
from the items a client adds to a conversation; the store makes them from a
finished response's output (:func:`output_items`).
"""

from __future__ import annotations

from typing import Any, Callable

#: the id prefix of an item by its type
PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def _parts(role: str, content: Any) -> list[dict[str, Any]]:
    """Message content as parts: a string becomes one text part of the role's kind."""
    if not isinstance(content, str):
        return [dict(part) for part in content]
    if role == "assistant":
        return [{"type": "output_text", "text": content, "annotations": []}]
    return [{"type": "input_text", "text": content}]


def listed_item(item: dict[str, Any], new_id: Callable[[str], str]) -> dict[str, Any]:
    """One checked input item as listed: its own id where it has one, else a new one."""
    kind = item.get("type") or "message"
    given = item.get("id")
    out: dict[str, Any] = {"id": given if isinstance(given, str) and given else new_id(PREFIXES[kind]), "type": kind}
    if kind == "message":
        role = item["role"]
        out.update(role=role, content=_parts(role, item["content"]), status=item.get("status") or "completed")
        return out
    if kind == "reasoning":
        out["summary"] = list(item.get("summary") or [])
        for name in ("content", "encrypted_content"):
            if item.get(name) is not None:
                out[name] = item[name]
        return out
    for name, value in item.items():
        if name not in ("id", "type") and value is not None:
            out[name] = value
    out.setdefault("status", "completed")
    return out


def input_items(given: Any, new_id: Callable[[str], str]) -> list[dict[str, Any]]:
    """A request's checked ``input`` (a string: one user message) as its listed items."""
    if isinstance(given, str):
        given = [{"role": "user", "content": given}]
    return [listed_item(item, new_id) for item in given]


def output_items(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The output items of a Response object as a conversation keeps them."""
    return [dict(item) for item in response.get("output") or ()]
