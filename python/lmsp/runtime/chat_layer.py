"""llama.cpp's chat layer for models whose template knows tools or thinks.

For such a model (its template renders tools and tool calls, or it has a
thinking block) a request is rendered as llama-server renders it with
``--jinja``: the template with the function tools, ``tool_choice``,
``parallel_tool_calls``, the output's JSON schema and the thinking switch
(``reasoning.effort``), through ``common_chat_templates_apply``
(``ChatTemplate.render``). That gives the prompt, the grammar that holds the
output to the model's own call format and the tools' schemas (lazy, with
its triggers, under ``auto``), the extra stop strings, and the parser of the
output (``ChatParser``), which :class:`~.chat_shaper.ChatShaper` reads the
output with. Any other request (or model) keeps the service's own call
format (:mod:`lmsp.calls`, :mod:`.prompt`).
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from .. import calls, history
from . import constraints
from .chat_shaper import ChatShaper

EFFORT_OFF = "none"
# the free text the chat layer's grammars allow before a call (content before the
# model's call markers), in the root rule: optional, so leaving it out keeps the rest
FREE_TEXT = re.compile(r"[ \t]+until-[0-9]+\?(?=[ \t]|$)", re.MULTILINE)
_CACHE_SIZE = 64


@dataclass(frozen=True)
class ChatPlan:
    """A request as the chat layer renders it."""

    tokens: list[int]
    grammar: dict[str, Any] | None
    stops: list[str]
    format: int
    generation_prompt: str
    parser: str
    thinking: bool  # the template has a thinking block


def template_of(engine: Any) -> Any:
    """The engine's chat template (None: it has none, or an engine without the chat layer)."""
    get = getattr(engine, "chat_template", None)
    return get() if callable(get) else None


def knows_tools(template: Any) -> bool:
    """Whether the template renders tools and tool calls (its capabilities)."""
    caps = template.caps
    return bool(caps.get("supports_tools") and caps.get("supports_tool_calls"))


def thinks(engine: Any) -> bool:
    """Whether the model's template has a thinking block (its thinking switch)."""
    template = template_of(engine)
    return template is not None and bool(template.supports_thinking)


def applies(engine: Any, request: dict[str, Any]) -> bool:
    """Whether the request runs on the chat layer: a chat (not a raw prompt) for a model
    whose template knows tools when the model may call them, or when its earlier turns
    hold calls, or thinks."""
    if request.get("prompt") is not None:
        return False
    template = template_of(engine)
    if template is None:
        return False
    if calls.mode(request) is not None:
        return knows_tools(template)
    if knows_tools(template) and holds_calls(request):
        return True
    return bool(template.supports_thinking)


def holds_calls(request: dict[str, Any]) -> bool:
    """Whether the request's earlier turns hold a function call or a call's output."""
    given = request.get("input")
    turns = [*(request.get("context") or ()), *(given if isinstance(given, list) else ())]
    return any(history.is_call(m) or history.is_output(m) for m in turns)


def thinking_switch(request: dict[str, Any]) -> bool | None:
    """``reasoning.effort`` as the template's thinking switch: ``none`` off, another
    effort on, none given: the template's default."""
    effort = (request.get("reasoning") or {}).get("effort")
    if effort is None:
        return None
    return effort != EFFORT_OFF


def _effort(request: dict[str, Any]) -> str:
    """``reasoning.effort`` for a template that reads it (``reasoning_effort``, as
    llama-server passes it): "" for none, or for ``none``, which the switch is."""
    effort = (request.get("reasoning") or {}).get("effort")
    return "" if effort in (None, EFFORT_OFF) else str(effort)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def chat_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's messages as OpenAI chat messages: ``instructions`` first as a system
    message, then its ``context`` (the earlier turns it continues, where it has one),
    then ``input`` (:mod:`lmsp.history`): function calls as an assistant's
    ``tool_calls``, those in a row, and any text right before them, one message as the
    model made it; their outputs as ``tool`` messages; reasoning as the
    ``reasoning_content`` of the assistant message after it."""
    out: list[dict[str, Any]] = []
    if request.get("instructions") is not None:
        out.append({"role": "system", "content": _text(request["instructions"])})
    given = request.get("input")
    items = list(request.get("context") or ())
    items += [{"role": "user", "content": given}] if isinstance(given, str) else list(given or ())
    reasoning: list[str] = []  # that of the next assistant message
    for item in items:
        if history.is_reasoning(item):
            reasoning.append(str(item["reasoning"]))
            continue
        message = _chat_message(item, None if reasoning or not out else out[-1])
        if message is None:  # a call joined the assistant message before it
            continue
        if message["role"] == "assistant" and reasoning:
            message["reasoning_content"] = "\n\n".join(reasoning)
        if message["role"] != "system":
            reasoning = []  # shown with the answer after it, else gone as the template would drop it
        out.append(message)
    return out


def _chat_message(item: Any, last: dict[str, Any] | None) -> dict[str, Any] | None:
    """One kept message as an OpenAI chat message; None when it is a call that joins
    ``last``, the message before it, an assistant's."""
    if not isinstance(item, dict):
        return {"role": "user", "content": str(item)}
    if history.is_call(item):
        call = {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item.get("name") or "", "arguments": item["arguments"]},
        }
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    if history.is_output(item):
        return {"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"])}
    role = {"developer": "system"}.get(item.get("role") or "user", item.get("role") or "user")
    return {"role": role, "content": _text(item.get("content"))}


def chat_tools(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The tools the model may call, as OpenAI chat tools."""
    if calls.mode(request) is None:
        return []
    return [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description") or "",
                "parameters": t.get("parameters") or constraints.ANY_OBJECT,
            },
        }
        for t in constraints.callable_tools(request)
    ]


class _Plans:
    """The plans of the latest requests, per engine (rendering a template with tools
    analyses it: not to be done again at each step of a task's start); an engine's
    go with it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.plans: weakref.WeakKeyDictionary[Any, dict[str, ChatPlan]] = weakref.WeakKeyDictionary()

    def get(self, engine: Any, request: dict[str, Any], messages: list[dict[str, Any]] | None = None) -> ChatPlan:
        """The plan of ``request`` (with ``messages`` for its chat messages, when given)."""
        messages = chat_messages(request) if messages is None else messages
        key = json.dumps([messages, chat_tools(request), _options(request)])
        with self.lock:
            plan = self.plans.get(engine, {}).get(key)
        if plan is None:
            plan = _render(engine, request, messages)
            with self.lock:
                mine = self.plans.setdefault(engine, {})
                if len(mine) >= _CACHE_SIZE:
                    mine.pop(next(iter(mine)))
                mine[key] = plan
        return plan


_plans = _Plans()


def _options(request: dict[str, Any]) -> list[Any]:
    mode = calls.mode(request)
    schema = constraints.output_schema(request) if mode is None else None
    parallel = bool(request.get("parallel_tool_calls", True))
    return [mode, parallel, schema, thinking_switch(request), _effort(request), most_calls(request)]


def require_call(grammar: dict[str, Any] | None) -> dict[str, Any] | None:
    """A chat-layer grammar for ``tool_choice`` ``required`` (or a named tool) that
    admits no text before the call: the chat layer's grammar lets the output say
    anything before the model's call markers, so that a call would be certain only
    within no bound of tokens; its root rule without that free text makes the
    first token after the prompt (and any thinking) the call's."""
    if grammar is None:
        return None
    lines = grammar["gbnf"].split("\n")
    for i, line in enumerate(lines):
        if line.startswith("root ::="):
            lines[i] = FREE_TEXT.sub("", line)
    return {**grammar, "gbnf": "\n".join(lines)}


# the chat layer's rule of a format whose calls each have their own markers: one or
# more, whatever parallel_tool_calls says
MANY_CALLS = re.compile(r"^tool-calls ::= \((.*)\)\+$", re.MULTILINE)


def single_call(grammar: dict[str, Any] | None, most: int = 1) -> dict[str, Any] | None:
    """A chat-layer grammar that admits ``most`` calls at most (one for
    ``parallel_tool_calls`` false, ``max_tool_calls``): the chat layer admits any
    number in a format whose calls each have their own markers
    (``<tool_call>...</tool_call>``)."""
    if grammar is None:
        return None
    times = "" if most == 1 else f"{{1,{most}}}"
    return {**grammar, "gbnf": MANY_CALLS.sub(rf"tool-calls ::= (\1){times}", grammar["gbnf"])}


def most_calls(request: dict[str, Any]) -> int | None:
    """The most calls an output may make: one without ``parallel_tool_calls``, else
    ``max_tool_calls`` (None: no bound)."""
    if not request.get("parallel_tool_calls", True):
        return 1
    most = request.get("max_tool_calls")
    return int(most) if most else None


def _render(engine: Any, request: dict[str, Any], messages: list[dict[str, Any]]) -> ChatPlan:
    mode, parallel, schema, thinking, _, most = _options(request)
    tools = chat_tools(request)
    rendered = template_of(engine).render(
        json.dumps(messages),
        tools=json.dumps(tools) if tools else "",
        tool_choice="required" if mode == "required" else "auto",
        # a bound holds by blocks of one call each (the chat layer's parallel calls in a
        # block know none)
        parallel_tool_calls=parallel and mode is not None and most is None,
        json_schema="" if schema is None else json.dumps(schema),
        enable_thinking=thinking,
        reasoning_effort=_effort(request),
    )
    tokens = list(engine.tokenize(rendered["prompt"], add_special=True, parse_special=True))
    grammar = require_call(rendered["grammar"]) if mode == "required" else rendered["grammar"]
    if mode is not None and most is not None:
        grammar = single_call(grammar, most)
    return ChatPlan(
        tokens=tokens,
        grammar=grammar,
        stops=list(rendered["additional_stops"]),
        format=int(rendered["format"]),
        generation_prompt=rendered["generation_prompt"],
        parser=rendered["parser"],
        thinking=bool(rendered["supports_thinking"]),
    )


def plan(engine: Any, request: dict[str, Any]) -> ChatPlan | None:
    """The chat layer's rendering of the request (None: it does not apply);
    ValueError when the template refuses it."""
    if not applies(engine, request):
        return None
    return _plans.get(engine, request)


def truncated_tokens(engine: Any, request: dict[str, Any], max_tokens: int) -> list[int]:
    """The chat layer's prompt of the request (which it applies to); with
    ``truncation: "auto"`` its oldest turns (every message but the system ones and the
    last) dropped, oldest first, as :func:`.prompt.truncated` drops them from the
    service's own (a ``tool`` message whose call went goes with it). Only the prompt
    changes: the grammar, stops and parser of a plan do not depend on the earlier
    turns."""
    from .truncation import budget, fewest_dropped

    messages = chat_messages(request)
    tokens = _plans.get(engine, request, messages).tokens
    if request.get("truncation") != "auto":
        return list(tokens)
    turns = [i for i, m in enumerate(messages) if m["role"] != "system"]

    def without(n: int) -> list[int]:
        while n < len(turns) - 1 and messages[turns[n]]["role"] == "tool":
            n += 1  # an output whose call went
        gone = set(turns[:n])
        return _plans.get(engine, request, [m for i, m in enumerate(messages) if i not in gone]).tokens

    return list(fewest_dropped(list(tokens), without, len(turns), budget(engine.n_ctx, max_tokens))[0])


def shaper(
    engine: Any, request: dict[str, Any], item_id: str, emitted: str = "", resume: dict[str, Any] | None = None
) -> ChatShaper | None:
    """The shaper of a task's output on the chat layer (None: not on it); ``resume``:
    the resumed task's snapshot (its message's log probabilities so far)."""
    found = plan(engine, request)
    if found is None:
        return None
    from .. import native  # the extension loads in the workers only

    parser = native.ChatParser(found.format, found.generation_prompt, found.parser)
    logprobs = (resume or {}).get("logprobs")
    return ChatShaper(parser.parse, item_id, emitted, thinks=found.thinking, logprobs=logprobs)
