"""How each server is asked for a streamed completion, and how its stream is read.

lmsp and llama-server both take ``POST /v1/responses`` and
``POST /v1/chat/completions``; llama-server also its native ``/completion``,
fed a prompt its own template rendered before the clock starts.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .sse import http_json

if TYPE_CHECKING:
    from .load import LoadConfig


class Protocol:
    """How to ask one server for a streamed completion and read its answer."""

    path = "/"

    def body(self, index: int, prompt: str, cfg: "LoadConfig", history: list[dict] = ()) -> dict:
        """The request for ``prompt``, a user message after the conversation ``history``."""
        raise NotImplementedError

    def on_event(self, event: str | None, data: str, st: dict) -> tuple[int, bool]:
        """Returns (output tokens this event carries, or -1 when it carries text
        but does not say how many; stream finished). Output text goes to st["text"]."""
        raise NotImplementedError


def _messages(prompt: str, history) -> list[dict]:
    return [*history, {"role": "user", "content": prompt}]


def _add_text(st: dict, text: str | None) -> None:
    if text:
        st["text"] = st.get("text", "") + text


def _sampling(cfg: "LoadConfig") -> dict:
    return {"temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": 1.0, "seed": None}


class ResponsesProtocol(Protocol):
    """``POST /v1/responses`` with ``stream: true`` (LMSP B.5; llama-server has it too)."""

    path = "/v1/responses"

    def __init__(self, model_id: str, extra: dict | None = None) -> None:
        self.model_id, self.extra = model_id, dict(extra or {})

    def body(self, index, prompt, cfg, history=()):
        given = _messages(prompt, history) if history else prompt
        body = {"model": self.model_id, "input": given, "max_output_tokens": cfg.max_tokens,
                "stream": True, **_sampling(cfg)}
        body["seed"] = cfg.seed + index
        body.update(self.extra)
        return body

    def on_event(self, event, data, st):
        if event is None and data.startswith("{"):
            event = json.loads(data).get("type")
        if event == "response.output_text.delta":
            _add_text(st, json.loads(data).get("delta"))
            return -1, False
        if event in ("response.completed", "response.incomplete"):
            usage = (json.loads(data).get("response") or {}).get("usage") or {}
            st["output_tokens"] = int(usage.get("output_tokens") or 0)
            st["input_tokens"] = int(usage.get("input_tokens") or 0)
            st["ok"] = True
            return 0, True
        if event in ("response.failed", "response.cancelled", "error"):
            st["error"] = f"{event}: {data[:200]}"
            return 0, True
        return 0, False


class CompletionProtocol(Protocol):
    """llama-server's native ``POST /completion``, fed the chat-templated prompt
    that its own chat endpoints would build (from ``/apply-template``)."""

    path = "/completion"

    def __init__(self, port: int) -> None:
        self.port = port
        self._templated: dict[str, str] = {}

    @staticmethod
    def key(prompt: str, history=()) -> str:
        return json.dumps(_messages(prompt, history))

    def prepare(self, prompt: str, history=()) -> None:
        key = self.key(prompt, history)
        if key in self._templated:
            return
        status, out = http_json(self.port, "POST", "/apply-template", {"messages": _messages(prompt, history)})
        if status != 200 or not out or "prompt" not in out:
            raise RuntimeError(f"llama-server /apply-template answered {status}: {out}")
        self._templated[key] = out["prompt"]

    def body(self, index, prompt, cfg, history=()):
        templated = self._templated[self.key(prompt, history)]
        body = {"prompt": templated, "n_predict": cfg.max_tokens, "stream": True,
                "min_p": 0.0, **_sampling(cfg)}
        body["seed"] = cfg.seed + index
        if not cfg.llama_prompt_cache:
            body["cache_prompt"] = False
        return body

    def on_event(self, event, data, st):
        msg = json.loads(data)
        _add_text(st, msg.get("content"))
        n = int(msg.get("tokens_predicted") or 0)
        carried = n - st.get("n_prev", 0)
        st["n_prev"] = n
        if msg.get("stop"):
            st["output_tokens"] = n
            st["input_tokens"] = int(msg.get("tokens_evaluated") or 0)
            st["ok"] = True
            return (carried if msg.get("content") else 0), True
        return (carried if msg.get("content") else 0), False


class ChatProtocol(Protocol):
    """OpenAI's ``POST /v1/chat/completions``: llama-server's (with its own fields), or
    the service's (``model_id`` named, OpenAI's fields and ``top_k``)."""

    path = "/v1/chat/completions"

    def __init__(self, model_id: str | None = None, *, llama: bool = True) -> None:
        self.model_id, self.llama = model_id, llama

    def body(self, index, prompt, cfg, history=()):
        body = {"messages": _messages(prompt, history), "max_tokens": cfg.max_tokens,
                "stream": True, "stream_options": {"include_usage": True}, **_sampling(cfg)}
        body["seed"] = cfg.seed + index
        if self.model_id is not None:
            body["model"] = self.model_id
        if self.llama:
            body.update(min_p=0.0)
            if not cfg.llama_prompt_cache:
                body["cache_prompt"] = False
        return body

    def on_event(self, event, data, st):
        if data.strip() == "[DONE]":
            st["ok"] = "output_tokens" in st
            if not st["ok"]:
                st["error"] = "stream ended without usage"
            return 0, True
        msg = json.loads(data)
        if msg.get("usage"):
            st["output_tokens"] = int(msg["usage"].get("completion_tokens") or 0)
            st["input_tokens"] = int(msg["usage"].get("prompt_tokens") or 0)
        for choice in msg.get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                _add_text(st, choice["delta"]["content"])
                return -1, False
        return 0, False


