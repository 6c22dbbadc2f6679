"""The service's own function-call format, for models whose chat template
knows no tools (docs/API.md, "Function tools").

The model answers a call as one JSON object, ``{"name": "<tool>",
"arguments": {...}}``, which a grammar made from the tools' schemas holds it
to: the name first, then the arguments, then the closing brace. Where the
request allows parallel calls (:func:`most_calls`), more such objects may
follow, each after the one before it (space between them), up to
``max_tool_calls``; otherwise the output is at most one call. So the output
splits without a parser: per call, the *head* (everything up to the
arguments' value, space before the brace included), the arguments (a JSON
object, whose end a count of its brackets finds), and the *tail* (the
closing brace, with any space around it). This module knows that split, the
ids of a call item, and how a call and its output are shown to the model
again in a later turn.

It imports nothing of the service: the API, the runtime and the store use it.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

# the head of a call: the opening brace, the name, up to the arguments' value
HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')
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


def most_calls(request: dict[str, Any]) -> int | None:
    """How many calls one output may make: 1 with ``parallel_tool_calls`` false, else
    ``max_tool_calls`` (None: any number)."""
    if request.get("parallel_tool_calls") is False:
        return 1
    most = request.get("max_tool_calls")
    return None if most is None else int(most)


class Scanner:
    """Where a JSON object or array ends, fed piece by piece: the depth of its braces
    and brackets outside strings."""

    def __init__(self) -> None:
        self.depth = 0
        self.string = False
        self.escape = False

    def feed(self, text: str) -> int | None:
        """The length of ``text`` up to the value's end (None: the value goes on)."""
        for i, c in enumerate(text):
            if self.string:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == '"':
                    self.string = False
            elif c == '"':
                self.string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return None


# what closes a call after its arguments: its brace (space before it)
CLOSE = re.compile(r"\s*\}")


def split_all(text: str) -> list[tuple[str, str]]:
    """Each call's ``(name, arguments)`` in the output's text, in order (empty: not a
    call); a call whose head is not whole yet is not there. Arguments cut short (the
    output ended inside them, or it is still coming) are all the text after the head."""
    out: list[tuple[str, str]] = []
    at = 0
    while True:
        h = head(text[at:])
        if h is None:
            return out
        start = at + h.length
        n = Scanner().feed(text[start:])
        if n is None:
            out.append((h.name, text[start:]))
            return out
        out.append((h.name, text[start : start + n]))
        closed = CLOSE.match(text, start + n)
        if closed is None:
            return out
        at = closed.end()


def kind(text: str) -> str | None:
    """``call`` when an output that may be text or a call opens a call, ``text`` when it
    does not, None while only space came."""
    if UNDECIDED.match(text):
        return None
    return "call" if OPENS_CALL.match(text) else "text"


def split(text: str) -> tuple[str, str] | None:
    """The first call's ``(name, arguments)`` (None: the output is not a call)."""
    found = split_all(text)
    return found[0] if found else None


def ids(item_id: str, index: int = 0) -> tuple[str, str]:
    """The id and the ``call_id`` of the output's call ``index``, from the response's
    output item id (the first call's bare, the next ones' with their index)."""
    suffix = item_id.split("_", 1)[-1] + (f"_{index}" if index else "")
    return f"fc_{suffix}", f"call_{suffix}"


def call_item(item_id: str, name: str, arguments: str, status: str, index: int = 0) -> dict[str, Any]:
    fc_id, call_id = ids(item_id, index)
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
