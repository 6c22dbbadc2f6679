"""A task's output split by the model's own chat format, while it is generated.

For a task on llama.cpp's chat layer (:mod:`.chat_layer`), the engine's text
goes through a :class:`ChatShaper`: the output so far is read by the chat
layer's parser (partial while it grows), and what the reading gained since
the last one becomes events (:mod:`lmsp.items.chat`): a ``reasoning`` item
with ``response.reasoning.delta``, a ``message`` with
``response.output_text.delta``, ``function_call`` items with
``response.function_call_arguments.delta``, each item opened when the reading
first shows it and ended when the next one opens (the last one ends with the
task: the store writes its end with the task's own status). The committer
takes them from :meth:`ChatShaper.made` after each push.

Log probabilities (a request that asked for them) go with the message's text
only: :meth:`ChatShaper.take_logprobs` gives the entries of a result's tokens
before its push; they wait until a push gains something, then the tokens
whose text makes up the message's delta go with that delta (and with the
message's done events); the others (reasoning, a call's markers and
arguments, what the format strips) are dropped (:func:`text_tokens`).

The events are a function of the reading of the output so far alone, and the
raw text a push consumed goes with its first event; a push that gains nothing
consumes nothing (the engine gives that text again after a resume, its
snapshot holding only what was committed). So a shaper made from the
committed text (:meth:`ChatShaper.__init__` with ``emitted``) is where the
last one was, and continues exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from lmsp.items import chat as ci
from ..objects import CHAT_OPEN, CHAT_THINK

Parse = Callable[[str, bool], dict[str, Any]]


@dataclass
class _Item:
    kind: str  # reasoning, message or function_call
    index: int  # output index
    item: dict[str, Any]  # as output_item.added shows it
    body: str = ""  # reasoning text, message text or arguments handed on so far
    source: int = -1  # the parsed call it shows (function_call)
    done: bool = False
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # a message's, handed on so far


Event = tuple[str, dict[str, Any]]


class ChatShaper:
    """One task's output on the chat layer (see the module docstring)."""

    def __init__(
        self,
        parse: Parse,
        item_id: str,
        emitted: str = "",
        thinks: bool = False,
        logprobs: list[dict[str, Any]] | None = None,
    ) -> None:
        self.parse = parse
        self.waiting: list[dict[str, Any]] = []  # log probabilities of tokens not placed yet
        self.mark = CHAT_THINK if thinks else CHAT_OPEN  # the task's item_open in the store
        self.item_id = item_id
        self.text = emitted
        self.items: list[_Item] = []
        self.calls = 0
        if emitted:  # where the committed output left it
            self._gain(self.parse(emitted, True), final=False)
            message = next((i for i in self.items if i.kind == "message"), None)
            if message is not None:  # the committed deltas' (``logprobs``), for its done events
                message.logprobs = list(logprobs or ())
        self.consumed = len(emitted)  # raw text handed on up to here
        self.rows: list[tuple[str, str | None, dict[str, Any]]] = []

    def take_logprobs(self, entries: list[dict[str, Any]]) -> None:
        """The log probabilities of the tokens of the next push's text."""
        self.waiting += entries

    def push(self, text: str, final: bool) -> dict[str, Any]:
        """The engine's next text, as the committer merges a shaper's: no ``delta`` (the
        events of the text are :meth:`made`'s), and whether this push ``consumed`` the
        output so far (one that gains nothing leaves it, with its tokens' log
        probabilities waiting: the committer holds its tokens back, so that a resume
        samples them again and gives those again)."""
        self.text += text
        parsed: dict[str, Any] | None
        try:
            parsed = self.parse(self.text, not final)
        except ValueError:
            parsed = self._cut_short() if final else None
        events = self._gain(parsed, final) if parsed is not None else []  # the last item ends with the task
        if events:
            self._place_logprobs(events)
            rows: list[tuple[str, str | None, dict[str, Any]]] = [(etype, None, p) for etype, p in events]
            rows[0] = (rows[0][0], self.text[self.consumed :], rows[0][2])
            self.consumed = len(self.text)
            self.rows += rows
        return {"delta": "", "consumed": bool(events)}

    def made(self) -> list[tuple[str, str | None, dict[str, Any]]]:
        """The events the pushes since the last call made: ``(type, raw text or None,
        payload)``, the raw text a push consumed on its first event."""
        rows, self.rows = self.rows, []
        return rows

    def _place_logprobs(self, events: list[Event]) -> None:
        """The waiting tokens whose text is in the message's delta onto that delta; the
        others are dropped (their text went to other items, or nowhere)."""
        waiting, self.waiting = self.waiting, []
        for etype, payload in events:
            if etype == ci.TEXT_DELTA:
                placed = text_tokens(waiting, payload["delta"])
                payload["logprobs"] = placed
                self.items[payload["output_index"]].logprobs += placed

    def _cut_short(self) -> dict[str, Any]:
        """The reading of a whole output that does not end as the format does (cut short
        by ``max_output_tokens``, say): as the output so far; else all of it text."""
        try:
            return self.parse(self.text, True)
        except ValueError:
            return {"content": self.text, "reasoning": "", "tool_calls": []}

    # ---------------------------------------------------------------- the reading
    def _gain(self, parsed: dict[str, Any], final: bool) -> list[Event]:
        """The events of what ``parsed`` shows beyond the items so far."""
        events: list[Event] = []
        reasoning = parsed.get("reasoning") or ""
        if reasoning:
            events += self._grow("reasoning", reasoning)
        content = parsed.get("content") or ""
        if content:
            events += self._grow("message", content)
        calls = parsed.get("tool_calls") or []
        for i, call in enumerate(calls):
            args = call.get("arguments") or ""
            if not (args or i + 1 < len(calls)):
                continue  # its name may still grow (or was cut short): opened once its arguments begin
            events += self._grow("function_call", args, source=i, name=call.get("name") or "")
        return events

    def _grow(self, kind: str, body: str, source: int = -1, name: str = "") -> list[Event]:
        """The events that bring the item of ``kind`` (the ``source``-th call) to ``body``."""
        item = next((i for i in self.items if i.kind == kind and i.source == source), None)
        events: list[Event] = []
        if item is None:
            events += self._close_last()
            item = self._open(kind, source, name, events)
        if item.done or body == item.body or not body.startswith(item.body):
            return events  # ended (what comes later is in the raw text only), or nothing new
        delta, item.body = body[len(item.body) :], body
        etype = {"reasoning": ci.REASONING_DELTA, "message": ci.TEXT_DELTA}.get(kind, ci.ARGS_DELTA)
        payload: dict[str, Any] = {"item_id": item.item["id"], "output_index": item.index}
        if kind != "function_call":
            payload["content_index"] = 0
        payload["delta"] = delta
        if kind == "message":
            payload["logprobs"] = []
        events.append((etype, payload))
        return events

    def _open(self, kind: str, source: int, name: str, events: list[Event]) -> _Item:
        index = len(self.items)
        first = not any(i.kind == kind for i in self.items)
        item_id, call_id = ci.item_ids(self.item_id, kind, 0 if first else index, self.calls)
        if kind == "function_call":
            self.calls += 1
        new = _Item(kind, index, ci.new_item(kind, item_id, call_id, name), source=source)
        self.items.append(new)
        events.append((ci.ADDED, {"output_index": index, "item": new.item}))
        if kind == "message":
            part = {"item_id": item_id, "output_index": index, "content_index": 0, "part": ci.text_part("")}
            events.append((ci.PART_ADDED, part))
        return new

    def _close_last(self) -> list[Event]:
        """The events that end the last item, if it is open."""
        if not self.items or self.items[-1].done:
            return []
        last = self.items[-1]
        last.done = True
        return ci.closing_events(last.item, last.index, last.body, "completed", last.logprobs)


def text_tokens(entries: list[dict[str, Any]], delta: str) -> list[dict[str, Any]]:
    """The entries (in order) of the tokens whose text makes up ``delta``, a message's
    text gained from them: where the delta is within their text (a format's markers
    around it), those whose bytes overlap it; where their text is within the delta (a
    token before them began it), all; where the delta ends with the start of their
    text, those overlapping that start. Otherwise none. Their text is read character by
    character as the engine decodes it (:func:`_decoded`): a U+FFFD of the delta is the
    invalid bytes it replaced. The tokens of an incomplete last character (their text
    shows in the next delta, after text a token before them began) go with the token
    before them, so that every token is placed once whatever the cut between deltas."""
    pieces = [bytes(e.get("bytes") or ()) for e in entries]
    raw = b"".join(pieces)
    if not delta or not raw:
        return []
    chars, starts, open_end = _decoded(raw)
    span = _span(chars, starts, raw, delta)
    if span is None:
        return []
    lo, hi = span
    held = starts[-2] if open_end else len(raw)  # where the incomplete last character begins
    out, pos, taken = [], 0, False
    for entry, piece in zip(entries, pieces):
        if piece:
            within = pos < hi and pos + len(piece) > lo
            taken = within or (taken and pos >= held)
            if taken:
                out.append(entry)
        pos += len(piece)
    return out


def _span(chars: str, starts: list[int], raw: bytes, delta: str) -> tuple[int, int] | None:
    """The bytes of ``raw`` (decoded as ``chars``, each beginning at ``starts``) that
    ``delta`` covers (see :func:`text_tokens`); None where it covers none."""
    at, opening = chars.find(delta), _continuing(raw)
    if at >= opening:  # the delta within their text, past bytes that may end a character begun before
        return starts[at], starts[at + len(delta)]
    ends = [starts[skip + k] for skip in range(opening + 1) for k in _after_earlier(chars, raw, delta, skip)]
    end = max(ends, default=0)
    if end:  # the delta begun before their text: from their start
        return 0, max(end, starts[at + len(delta)] if at >= 0 else 0)
    return (starts[at], starts[at + len(delta)]) if at >= 0 else None


def _after_earlier(chars: str, raw: bytes, delta: str, skip: int) -> list[int]:
    """How many characters of ``chars`` after the first ``skip`` bytes (the end of a
    character the delta holds, begun before them) end the delta (all where it holds
    them within it); none where it does not read so."""
    rest, tail = chars[skip:], raw[:skip]
    within = delta.find(rest) if rest else -1
    if within >= 0 and _ends(delta[:within], tail):
        return [len(rest)]
    for k in range(min(len(rest), len(delta)), -1, -1):
        if (k or skip) and delta.endswith(rest[:k]) and _ends(delta[: len(delta) - k], tail):
            return [k]
    return []


def _continuing(raw: bytes) -> int:
    """How many bytes (up to 3) open ``raw`` that can only continue a character."""
    return next((i for i, b in enumerate(raw[:3]) if not 0x80 <= b <= 0xBF), min(len(raw), 3))


def _ends(text: str, tail: bytes) -> bool:
    """Whether ``text`` can end with a character whose last bytes are ``tail`` (its
    first ones before them): any text when there are none."""
    if not tail:
        return True
    last = text[-1:]
    return last == "\ufffd" or (len(last.encode()) > len(tail) and last.encode().endswith(tail))


def _decoded(raw: bytes) -> tuple[str, list[int], bool]:
    """``raw`` as the engine decodes it (csrc/text.cpp, like Python's
    ``errors="replace"``): each valid UTF-8 sequence its character, each maximal
    ill-formed subpart one U+FFFD, an incomplete last character one U+FFFD too
    (``True``: there is one, its text undecided until the bytes after it come); and
    where each character begins (``len(raw)`` last)."""
    chars, starts, i, complete = [], [], 0, True
    while i < len(raw):
        n, valid, complete = _sequence(raw, i)
        chars.append(raw[i : i + n].decode() if valid else "\ufffd")
        starts.append(i)
        i += n
    starts.append(len(raw))
    return "".join(chars), starts, not complete


def _sequence(raw: bytes, i: int) -> tuple[int, bool, bool]:
    """The character at ``raw[i]``: (its length, valid, complete); an invalid one is its
    maximal ill-formed subpart; an incomplete one is at the end of ``raw``."""
    c = raw[i]
    if c < 0x80:
        return 1, True, True
    if not 0xC2 <= c <= 0xF4:
        return 1, False, True
    need = 2 if c <= 0xDF else 3 if c <= 0xEF else 4
    lo = {0xE0: 0xA0, 0xF0: 0x90}.get(c, 0x80)  # no overlong forms
    hi = {0xED: 0x9F, 0xF4: 0x8F}.get(c, 0xBF)  # no surrogates, nothing above U+10FFFF
    for k in range(1, need):
        if i + k == len(raw):
            return k, False, False
        if not (lo if k == 1 else 0x80) <= raw[i + k] <= (hi if k == 1 else 0xBF):
            return k, False, True
    return need, True, True
