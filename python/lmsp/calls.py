"""The service's own function-call format, for models whose chat template
knows no tools (docs/API.md, "Function tools").

The model answers a call as one JSON object, ``{"name": "<tool>",
"arguments": {...}}``, which a grammar made from the tools' schemas holds it
to: the name first, then the arguments, then the closing brace. So the
output splits without a parser: the *head* (everything up to the arguments'
value), the arguments, and the *tail* (the closing brace, with any space
before it). This module knows that split, the ids of a call item, and how a
call and its output are shown to the model again in a later turn.

It imports nothing of the service: the API, the runtime and the store use it.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

# the head of a call: the opening brace, the name, up to the arguments' value
HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')
# what may still be the tail: space, the closing brace, space
TAIL = re.compile(r"\s*\}?\s*\Z")
OPENS_CALL = re.compile(r"\s*\{")
UNDECIDED = re.compile(r"\s*\Z")


def mode(request: dict[str, Any]) -> str | None:
    """``required`` (a call is the only output: ``tool_choice`` ``required`` or a named
    tool), ``auto`` (text or a call), or None (no tools, or ``tool_choice`` ``none``)."""
    if not request.get("tools"):
        return None
    choice = request.get("tool_choice") or "auto"
    if choice == "none":
        return None
    return "auto" if choice == "auto" else "required"


class Head(NamedTuple):
    name: str
    length: int  # of the head's text


def head(text: str) -> Head | None:
    """The call's head at the start of ``text``, once it is all there."""
    m = HEAD.match(text)
    if m is None:
        return None
    try:
        name = json.loads(m.group(1))
    except ValueError:
        return None
    return Head(name if isinstance(name, str) else "", m.end())


STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
SPACE = re.compile(r"\s*")
# the head's parts after space each: None is the name (a JSON string)
HEAD_PARTS = ("{", '"name"', ":", None, ",", '"arguments"', ":")


def may_open(text: str) -> bool:
    """Whether ``text`` may still be (or already is) the start of a call: false as
    soon as it leaves the head's form (JSON text that is not a call, say)."""
    i = 0
    for part in HEAD_PARTS:
        i = SPACE.match(text, i).end()  # type: ignore[union-attr]
        if i == len(text):
            return True
        if part is None:
            m = STRING.match(text, i)
            if m is None:
                return text[i] == '"'  # a name still coming
            i = m.end()
            continue
        n = min(len(part), len(text) - i)
        if text[i : i + n] != part[:n]:
            return False
        i += n
        if n < len(part):
            return True
    return True


def tail_start(text: str) -> int:
    """Where what may be the call's tail begins in ``text`` (the arguments so far, the rest)."""
    m = TAIL.search(text)
    return m.start() if m else len(text)


def kind(text: str) -> str | None:
    """``call`` when an output that may be text or a call opens a call, ``text`` when it
    does not, None while only space came."""
    if UNDECIDED.match(text):
        return None
    return "call" if OPENS_CALL.match(text) else "text"


def split(text: str, finished: bool) -> tuple[str, str] | None:
    """A call's ``(name, arguments)`` from the output's text (None: not a call); the
    tail is cut off a finished output's arguments only."""
    h = head(text)
    if h is None:
        return None
    args = text[h.length :]
    if finished:
        args = args[: tail_start(args)]
    return h.name, args


def ids(item_id: str) -> tuple[str, str]:
    """The call item's id and its ``call_id``, from the response's output item id."""
    suffix = item_id.split("_", 1)[-1]
    return f"fc_{suffix}", f"call_{suffix}"


def call_item(item_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    fc_id, call_id = ids(item_id)
    return {
        "type": "function_call",
        "id": fc_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def as_text(name: str, arguments: str) -> str:
    """A call as the model writes it (an assistant turn of a later request)."""
    return f'{{"name": {json.dumps(name)}, "arguments": {arguments}}}'


def output_text(name: str | None, call_id: str, output: str) -> str:
    """A call's output as the model reads it (a user turn of a later request)."""
    what = f"{name} (call {call_id})" if name else f"call {call_id}"
    return f"Result of {what}:\n{output}"
