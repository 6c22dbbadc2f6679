"""A task's output as text or as function calls, while it is generated.

For a request that lets the model call tools (:func:`lmsp.calls.mode`), the
engine's text goes through a :class:`CallShaper` before the store: an output
that opens with a call's head (any output, with ``tool_choice`` ``required``
or a named tool) is calls in the service's format, else it is text, handed
on as it comes. Of each call, the head (up to the arguments) is held back
until it is whole and something follows it, the arguments are handed on as
they come, and the tail (the closing brace) is held until the next call's
head opens (the call is done) or the output ends. Text held back is the
engine's to give again after a resume (its snapshot holds only what was
committed, which always ends in text or in a call's arguments), so a shaper
made from the committed text continues exactly.
"""

from __future__ import annotations

from typing import Any

from lmsp import calls


class CallShaper:
    """One task's output, split as it comes (see the module docstring)."""

    def __init__(self, mode: str, emitted: str = "") -> None:
        self.mode = mode
        self.text = ""  # the output so far
        self.done = 0  # handed on up to here
        self.kind: str | None = "call" if mode == "required" else None
        self.index = -1  # the open call (-1: none yet)
        self.name = ""  # the open call's name
        self.args_at = 0  # where its arguments start in the text
        self.args_end: int | None = None  # where they end (None: not yet)
        self.scanner = calls.Scanner()
        if emitted:  # what was committed: handed on already
            self.push(emitted, False)
            self.done = len(emitted)

    @classmethod
    def for_request(cls, request: dict[str, Any], emitted: str = "") -> CallShaper | None:
        mode = calls.mode(request)
        return None if mode is None else cls(mode, emitted)

    def push(self, text: str, final: bool) -> dict[str, Any]:
        """The engine's next text; what to hand on of the output so far, as the store
        item's fields: ``delta`` for text, ``calls`` for calls (see :meth:`_calls`)."""
        self.text += text
        if self.kind is None:
            self.kind = calls.kind(self.text) or ("text" if final else None)
        if self.kind == "call":
            segments = self._calls(final)
            if segments is not None:
                return {"calls": segments} if segments else {"delta": ""}
            self.kind = "text"  # it did not become a call: what came is text
        if self.kind is None:
            return {"delta": ""}
        delta, self.done = self.text[self.done :], len(self.text)
        return {"delta": delta}

    def _calls(self, final: bool) -> list[dict[str, Any]] | None:
        """The segments of calls to hand on, in order, each ``{"index", "args"}`` with
        ``call`` (``{"name", "head"}``) where call ``index`` opens, ``done`` (``{"tail",
        "name", "arguments"}``) where it ends before the next one opens, and ``tail``
        where the output ends; None when the output did not open a call after all."""
        out: list[dict[str, Any]] = []
        while True:
            if self.index >= 0 and self.args_end is None:
                self._scan()
                end = len(self.text) if self.args_end is None else self.args_end
                add(out, {"index": self.index, "args": self.text[self.done : end]})
                self.done = end
                if self.args_end is None:
                    break
            if not self._open_next(out, final):
                break
        if self.index < 0:
            return [] if not final and calls.may_open(self.text) else None
        if final:
            add(out, {"index": self.index, "args": "", "tail": self.text[self.done :]})
            self.done = len(self.text)
        return out

    def _scan(self) -> None:
        """Find where the open call's arguments end, in the text not scanned yet."""
        at = max(self.done, self.args_at)
        n = self.scanner.feed(self.text[at:])
        if n is not None:
            self.args_end = at + n

    def _open_next(self, out: list[dict[str, Any]], final: bool) -> bool:
        """Open the next call once its head is whole and text follows it (the one before
        it done, with its tail); False while it is not there."""
        at = 0 if self.index < 0 else self.args_end
        assert at is not None
        if self.index >= 0:
            closed = calls.CLOSE.match(self.text, at)
            if closed is None:
                return False
            at = closed.end()
        h = calls.head(self.text[at:])
        if h is None or (at + h.length == len(self.text) and not final):
            return False  # not whole, or space may still come before the arguments
        if self.index >= 0:
            done = {"tail": self.text[self.done : at], "name": self.name,
                    "arguments": self.text[self.args_at : self.args_end]}  # fmt: skip
            add(out, {"index": self.index, "args": "", "done": done})
        self.index += 1
        self.name, self.args_at, self.args_end = h.name, at + h.length, None
        self.scanner = calls.Scanner()
        out.append({"index": self.index, "call": {"name": h.name, "head": self.text[at : self.args_at]}, "args": ""})
        self.done = self.args_at
        return True


def add(segments: list[dict[str, Any]], segment: dict[str, Any]) -> None:
    """Append a segment of calls (:meth:`CallShaper._calls`) to ``segments``: into the
    last one when it is the same call's and not done (the arguments joined)."""
    last = segments[-1] if segments else None
    if last is None or last["index"] != segment["index"] or "done" in last or "tail" in last or "call" in segment:
        segments.append(dict(segment))
        return
    last["args"] += segment["args"]
    for key in ("done", "tail"):
        if key in segment:
            last[key] = segment[key]
