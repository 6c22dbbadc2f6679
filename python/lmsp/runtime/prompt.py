"""From a stored request to engine input: messages, chat template, sampling.

The prompt is the model's own chat template rendered by llama.cpp's Jinja
engine and tokenized as llama-server does it (``Engine.chat_prompt``); a model
without a template gets the plain format of ``docs/API.md``.
"""

from __future__ import annotations

import json
from typing import Protocol, Sequence

from .. import calls, history
from ..objects import wants_logprobs
from . import constraints
from .truncation import budget, fewest_dropped


class ChatEngine(Protocol):
    """What rendering asks of an engine (``lmsp.native.Engine`` has it)."""

    def chat_prompt(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]: ...

    @property
    def n_ctx(self) -> int: ...


ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "input_text", "text": ...}]
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return str(content)


def messages_for(request: dict) -> list[dict]:
    """The chat messages of a request: ``instructions`` first as a system message (an empty
    one too, as llama-server makes it), then its ``context`` (the messages of the earlier
    turns it continues: a previous response's, a conversation's), then ``input``."""
    messages = []
    instructions = request.get("instructions")
    if instructions is not None:
        messages.append({"role": "system", "content": _text(instructions)})
    for message in request.get("context") or ():
        messages.append(_message(message))
    given = request.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for message in given:
            if isinstance(message, str):
                messages.append({"role": "user", "content": message})
            elif isinstance(message, dict):
                messages.append(_message(message))
    return with_tools(messages, request)


def _message(message: dict) -> dict:
    """A kept message with its role as the template takes it and its content one text;
    the rest (a call's or an output's parts, :mod:`lmsp.history`) as it is."""
    return {
        **message,
        "role": ROLES.get(message.get("role") or "user", "user"),
        "content": _text(message.get("content")),
    }


def tools_text(request: dict) -> str:
    """The system text that tells the model its tools and the call format (:mod:`lmsp.calls`)."""
    tools = constraints.callable_tools(request)
    lines = ["You can call these functions. Each one's arguments are a JSON object of this schema:"]
    for tool in tools:
        described = {
            "name": tool["name"],
            "description": tool.get("description") or "",
            "parameters": tool.get("parameters"),
        }
        lines.append(json.dumps(described))
    lines.append(
        'To call a function, answer with only this JSON object: {"name": <function name>, "arguments": <its arguments>}'
    )
    if calls.most_calls(request) != 1:
        lines.append("To call several functions at once, write one such object per line.")
    if constraints.tool_mode(request) == "auto":
        answer = "as JSON" if constraints.output_schema(request) is not None else "in plain text"
        lines.append(f"Call a function only when it helps; otherwise answer {answer}.")
    elif len(tools) == 1:
        lines.append(f"Call {tools[0]['name']} now.")
    else:
        lines.append("Call one of them now.")
    return "\n".join(lines)


def with_tools(messages: list[dict], request: dict) -> list[dict]:
    """The messages with the tools described in the system message (its end, or a new
    first one), when the request lets the model call tools."""
    if constraints.tool_mode(request) is None:
        return messages
    text = tools_text(request)
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        joined = f"{first['content']}\n\n{text}" if first["content"] else text
        return [{"role": "system", "content": joined}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def render(engine: ChatEngine, messages: list[dict]) -> list[int]:
    """Prompt token ids: the model's chat template with the assistant's turn opened
    over the messages as a template without tools takes them (:func:`lmsp.history.plain_turns`),
    tokenized with the model's special tokens (BOS where it asks for one) and
    special-token text parsed, as llama-server feeds a chat to the model."""
    return list(engine.chat_prompt(history.plain_turns(messages), add_generation_prompt=True))


def render_request(engine: ChatEngine, messages: list[dict], request: dict, max_tokens: int) -> list[int]:
    """The prompt of ``messages``; with ``truncation: "auto"`` the oldest turns (every
    message but the system ones and the last) are dropped, oldest first, until the
    prompt leaves room for ``max_tokens`` of output (at most half the context), as
    OpenAI truncates. Otherwise, and when even the last turn does not fit, the whole
    prompt: the caller's context check refuses it."""
    return truncated(engine, messages, request, max_tokens)[0]


def truncated(engine: ChatEngine, messages: list[dict], request: dict, max_tokens: int) -> tuple[list[int], int]:
    """:func:`render_request`'s prompt, and how many of the oldest turns it dropped."""
    tokens = render(engine, messages)
    if request.get("truncation") != "auto":
        return tokens, 0
    turns = [i for i, m in enumerate(messages) if m.get("role") != "system"]

    def without(n: int) -> list[int]:  # the prompt less its ``n`` oldest turns
        gone = set(turns[:n])
        return render(engine, [m for i, m in enumerate(messages) if i not in gone])

    return fewest_dropped(tokens, without, len(turns), budget(engine.n_ctx, max_tokens))


def seen_context(request: dict, dropped: int) -> list[dict] | None:
    """The ``context`` of a request less the turns truncation dropped from its prompt
    (``dropped``: :func:`truncated`'s count; they are its oldest turns, as only system
    messages come before it), so that rendering it again gives the same prompt; None
    when it loses nothing."""
    context = list(request.get("context") or ())
    lose = min(dropped, sum(1 for m in context if ROLES.get(m.get("role") or "user", "user") != "system"))
    if lose <= 0:
        return None
    out = []
    for message in context:
        if lose and ROLES.get(message.get("role") or "user", "user") != "system":
            lose -= 1
            continue
        out.append(message)
    return out


def prompt_tokens(engine, request: dict, max_tokens: int) -> list[int]:
    """The prompt's token ids of a request: a completion's raw ``prompt`` (no chat
    template), else the chat layer's prompt where it applies (:mod:`.chat_layer`), else
    its messages through the chat template (:func:`render_request`)."""
    raw = request.get("prompt")
    if raw is None:
        from . import chat_layer

        found = chat_layer.plan(engine, request)
        if found is not None:  # the model's own chat layer (tools, thinking)
            return chat_layer.truncated_tokens(engine, request, max_tokens)
        return render_request(engine, messages_for(request), request, max_tokens)
    suffix = request.get("suffix")
    if suffix is not None:
        return fill_in_the_middle(engine, raw, suffix)
    if isinstance(raw, str):
        # as llama-server tokenizes a completion's prompt: BOS added, special-token text parsed
        return list(engine.tokenize(raw, add_special=True, parse_special=True))
    tokens = [int(t) for t in raw]  # token ids as given
    check_vocabulary(tokens, engine.n_vocab)
    return tokens


def check_vocabulary(tokens: list[int], n_vocab: int) -> None:
    """ValueError for a token id outside the model's vocabulary."""
    for t in tokens:
        if not 0 <= t < n_vocab:
            raise ValueError(f"token id {t} is outside the vocabulary of {n_vocab} tokens")


def fill_in_the_middle(engine, prefix: str | list[int], suffix: str) -> list[int]:
    """The prompt of a completion between ``prefix`` and ``suffix``, in the model's
    fill-in-the-middle tokens (prefix-suffix-middle order, as llama-server's infill);
    ValueError where the model has none."""
    fim = list(engine.info.get("fim_tokens") or [])
    if len(fim) != 3:
        raise ValueError("the model has no fill-in-the-middle tokens: 'suffix' cannot be used with it")
    pre, suf, mid = fim
    head = prefix if isinstance(prefix, list) else list(engine.tokenize(prefix, add_special=False, parse_special=False))
    tail = list(engine.tokenize(suffix, add_special=False, parse_special=False))
    bos = list(engine.tokenize("", add_special=True, parse_special=False))
    return bos + [pre, *head, suf, *tail, mid]


def sampling(request: dict, config, engine=None) -> dict:
    """The engine's ``submit`` keywords from a request (service defaults and caps applied;
    the grammar of its output's form, :mod:`.constraints`, or with ``engine`` that of
    the model's own chat layer where it applies, :mod:`.chat_layer`)."""

    def pick(name, default):
        value = request.get(name)
        return default if value is None else value

    max_tokens = int(pick("max_output_tokens", config.max_output_tokens))
    stop = request.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    out = {
        "max_tokens": max(1, min(max_tokens, config.max_output_tokens_cap)),
        "temperature": float(pick("temperature", 1.0)),
        "top_p": float(pick("top_p", 1.0)),
        "top_k": int(pick("top_k", 0)),
        "seed": int(pick("seed", 0)),
        "stop": [s for s in stop if isinstance(s, str) and s],
        "grammar": constraints.grammar(request),
    }
    from .chat_layer import plan

    found = None if engine is None else plan(engine, request)
    if found is not None:
        out["grammar"] = found.grammar
        out["stop"] += [s for s in found.stops if s not in out["stop"]]
    if wants_logprobs(request):  # on the chat layer, its message's tokens get them (runtime.chat_shaper)
        out["logprobs"] = True
        if request.get("top_logprobs"):
            out["top_logprobs"] = int(request["top_logprobs"])
    return out
