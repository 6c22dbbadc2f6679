"""A task's output as text or as a function call, while it is generated.

For a request that lets the model call tools (:func:`lmsp.calls.mode`), the
engine's text goes through a :class:`CallShaper` before the store: an output
that opens with a call's head (any output, with ``tool_choice`` ``required``
or a named tool) is a call in the service's format, whose head (up to the
arguments) is held back until it is whole, whose arguments are handed on as
they come, and whose tail (the closing brace) is held until the end; any
other output is text, handed on as it comes. Text held back is the engine's
to give again after a resume (its snapshot holds only what was committed),
so a shaper made from the committed text continues exactly.
"""

from __future__ import annotations

from typing import Any

from .. import calls


class CallShaper:
    """One task's output, split as it comes (see the module docstring)."""

    def __init__(self, mode: str, emitted: str = "") -> None:
        self.mode = mode
        self.text = emitted  # the output so far
        self.done = len(emitted)  # handed on up to here
        self.kind: str | None = "call" if mode == "required" else calls.kind(emitted)
        self.head = calls.head(emitted) if self.kind == "call" else None
        if self.head is not None and self.head.length == len(emitted):
            self.head = None  # committed as far as the head only: the call is not open yet

    @classmethod
    def for_request(cls, request: dict[str, Any], emitted: str = "") -> CallShaper | None:
        mode = calls.mode(request)
        return None if mode is None else cls(mode, emitted)

    def push(self, text: str, final: bool) -> dict[str, Any]:
        """The engine's next text; what to hand on of the output so far, as the store
        item's fields: ``delta`` for text, ``args`` (with ``call`` when the call opens,
        ``tail`` when it ends) for a call."""
        self.text += text
        if self.kind is None:
            self.kind = calls.kind(self.text) or ("text" if final else None)
        if self.kind == "call" and self.head is None:
            self.head = calls.head(self.text)
            if self.head is not None and self.head.length == len(self.text) and not final:
                self.head = None  # space may still come before the arguments: not in them
            if self.head is None:
                if not final and calls.may_open(self.text):
                    return {"delta": ""}
                self.kind = "text"  # it did not become a call: what came is text
            else:
                out = {"call": {"name": self.head.name, "head": self.text[: self.head.length]}}
                self.done = self.head.length
                return {**out, **self.arguments(final)}
        if self.kind == "call":
            return self.arguments(final)
        if self.kind is None:
            return {"delta": ""}
        delta, self.done = self.text[self.done :], len(self.text)
        return {"delta": delta}

    def arguments(self, final: bool) -> dict[str, Any]:
        """The arguments since the last hand-on (what may be the tail held back until the end)."""
        end = self.done + calls.tail_start(self.text[self.done :])
        out: dict[str, Any] = {"args": self.text[self.done : end]}
        if final:
            out["tail"] = self.text[end:]
            self.done = len(self.text)
        else:
            self.done = end
        return out
