"""Earlier turns as a task's messages keep them, whichever API sent them.

A request's messages (its ``input`` and ``context``) are chat messages
(``role``, ``content``) with three kinds besides plain text:

- a function call the model made: an assistant message whose ``content`` is
  the call in the service's own format (:func:`lmsp.calls.as_text`), with the
  call's ``call_id``, ``name`` and ``arguments``;
- a call's output: a user message whose ``content`` names the call
  (:func:`lmsp.calls.output_text`), with ``call_id`` and ``output``;
- the model's earlier reasoning: an assistant message with empty ``content``
  and the text in ``reasoning``.

A template that knows tools gets the calls, outputs and reasoning as such
(:mod:`lmsp.runtime.chat_layer`). Any other gets :func:`plain_turns`: the
reasoning dropped, calls in a row (and the assistant text right before
them) as one assistant turn with one call per line (as the model writes
parallel calls), outputs in a row as one user turn.

It imports nothing of the service but the call format.
"""

from __future__ import annotations

from typing import Any

from . import calls


def call_message(name: str, arguments: str, call_id: str) -> dict[str, str]:
    """A function call the model made, as a message."""
    return {
        "role": "assistant",
        "content": calls.as_text(name, arguments),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def output_message(name: str | None, call_id: str, output: str) -> dict[str, str]:
    """A call's output, as a message."""
    return {"role": "user", "content": calls.output_text(name, call_id, output), "call_id": call_id, "output": output}


def reasoning_message(text: str) -> dict[str, str]:
    """The model's earlier reasoning, as a message."""
    return {"role": "assistant", "content": "", "reasoning": text}


def reasoning_text(item: dict[str, Any]) -> str:
    """A Responses ``reasoning`` item's text: its ``reasoning_text`` parts."""
    parts = item.get("content") or ()
    return "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


def is_call(message: Any) -> bool:
    return isinstance(message, dict) and "arguments" in message and "call_id" in message


def is_output(message: Any) -> bool:
    return isinstance(message, dict) and "output" in message and "call_id" in message


def is_reasoning(message: Any) -> bool:
    return isinstance(message, dict) and "reasoning" in message


def plain_turns(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The messages for a template that knows no tools (see the module docstring):
    ``role`` and ``content`` only."""
    out: list[dict[str, str]] = []
    last = ""  # the kind of the last message out: call, output or ""
    for message in messages:
        if is_reasoning(message):
            continue
        kind = "call" if is_call(message) else "output" if is_output(message) else ""
        if kind and (kind == last or (kind == "call" and out and out[-1]["role"] == "assistant")):
            joint = "\n" if kind == "call" else "\n\n"
            out[-1] = {**out[-1], "content": out[-1]["content"] + joint + message["content"]}
            continue
        out.append({"role": message["role"], "content": message["content"]})
        last = kind
    return out
