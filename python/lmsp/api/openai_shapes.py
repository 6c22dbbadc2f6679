"""The objects of OpenAI's Chat Completions, Completions and Embeddings APIs,
made from the service's own: a chat completion or a text completion is a
response of the store (its task, events and Response object), shown in
OpenAI's shape; its stream is the task's event log written as OpenAI's chunks
(:class:`ChunkFraming`), ending with ``data: [DONE]``.
"""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal

from lmsp.errors import LMSPError

from .common import dumps
from .events import SseFraming
from .openai_logprobs import LegacyLogprobs, chat_logprobs, legacy_logprobs, response_logprobs

DONE = b"data: [DONE]\n\n"
Kind = Literal["chat.completion", "text_completion"]
# the events of a function call item that a chat completion's stream shows as tool call deltas
CALL_EVENTS = ("response.output_item.added", "response.function_call_arguments.delta")
# a failed task's error code -> the status of the plain request that waited for it
FAILED_STATUS = {"context_length_exceeded": 400, "invalid_request": 400, "model_changed": 409}


def data_frame(obj: dict[str, Any]) -> bytes:
    """One SSE frame with only a ``data`` line (OpenAI's chunks carry no id or event name)."""
    return f"data: {dumps(obj)}\n\n".encode("utf-8")


def output_text(response: dict[str, Any]) -> str:
    """The text of a Response object's output message ('' when there is none yet)."""
    for item in response.get("output") or []:
        for part in item.get("content") or []:
            if part.get("type") == "output_text":
                return str(part.get("text") or "")
    return ""


def function_calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The function call items of a Response object's output, in order (none: its
    output is text)."""
    return [dict(item) for item in response.get("output") or [] if item.get("type") == "function_call"]


def tool_call(item: dict[str, Any], arguments: str | None = None) -> dict[str, Any]:
    """A function call item as Chat Completions' tool call (``arguments``: instead of its own)."""
    args = (item.get("arguments") or "") if arguments is None else arguments
    return {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": args}}


def finish_reason(response: dict[str, Any]) -> str | None:
    """``stop``, ``tool_calls`` or ``length`` for a finished response; None while it runs
    (or when it failed or was cancelled)."""
    status = response.get("status")
    if status == "completed":
        return "tool_calls" if function_calls(response) else "stop"
    if status == "incomplete":
        return "length"
    return None


def usage(response: dict[str, Any]) -> dict[str, Any] | None:
    """A Response object's usage in Chat Completions' terms (None before the end)."""
    given = response.get("usage")
    if not given:
        return None
    prompt, completion = int(given["input_tokens"]), int(given["output_tokens"])
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {
            "cached_tokens": int(given["input_tokens_details"]["cached_tokens"]),
            "audio_tokens": 0,
        },
        "completion_tokens_details": {
            "reasoning_tokens": int((given.get("output_tokens_details") or {}).get("reasoning_tokens") or 0),
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def reasoning_text(response: dict[str, Any]) -> str:
    """The text of a Response object's reasoning item ('' when there is none)."""
    for item in response.get("output") or []:
        if item.get("type") == "reasoning":
            return "".join(str(part.get("text") or "") for part in item.get("content") or [])
    return ""


def with_reasoning(message: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """A chat message with the reasoning of a thinking model's answer, as llama-server
    sends it (``reasoning_content``); as it is without one."""
    reasoning = reasoning_text(response)
    return {**message, "reasoning_content": reasoning} if reasoning else message


def _extras(response: dict[str, Any]) -> dict[str, Any]:
    """What LMSP adds to OpenAI's object, as it adds to the Response object."""
    return {
        "seed": response.get("seed"),
        "metadata": response.get("metadata") or {},
        "error": response.get("error"),
        "task": response.get("task"),
    }


def chat_completion(response: dict[str, Any], logprobs: bool = False) -> dict[str, Any]:
    """The ``chat.completion`` of a response of the store; ``logprobs``: its request
    asked for them."""
    made = function_calls(response)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if made else output_text(response),
        "refusal": None,
        "annotations": [],
    }
    if made:
        message["tool_calls"] = [tool_call(call) for call in made]
    return {
        "id": response["id"],
        "object": "chat.completion",
        "created": response["created_at"],
        "model": response["model"],
        "choices": [
            {
                "index": 0,
                "message": with_reasoning(message, response),
                "logprobs": chat_logprobs(response_logprobs(response)) if logprobs else None,
                "finish_reason": finish_reason(response),
            }
        ],
        "usage": usage(response),
        "system_fingerprint": None,
        "service_tier": "default",
        **_extras(response),
    }


def text_completion(
    response: dict[str, Any], echo: str = "", logprobs: bool = False, echo_pieces: tuple[bytes, ...] = ()
) -> dict[str, Any]:
    """The ``text_completion`` of a response of the store; ``echo``: the prompt's text
    when the request asked for it in front of the output (``echo_pieces``: its
    tokens' bytes); ``logprobs``: the request asked for them."""
    entries = response_logprobs(response)
    choice = {
        "index": 0,
        "text": echo + output_text(response),
        "logprobs": legacy_logprobs(entries, list(echo_pieces), echo) if logprobs else None,
        "finish_reason": finish_reason(response),
    }
    return {
        "id": response["id"],
        "object": "text_completion",
        "created": response["created_at"],
        "model": response["model"],
        "choices": [choice],
        "usage": usage(response),
        "system_fingerprint": None,
        **_extras(response),
    }


def ended_error(response: dict[str, Any]) -> LMSPError | None:
    """The error a plain request gets for a response that failed or was cancelled
    (OpenAI's endpoints have no such objects); None for a finished one."""
    if response["status"] == "failed":
        error = response.get("error") or {}
        code = str(error.get("code") or "internal_error")
        exc = LMSPError(str(error.get("message") or "the task failed"), code=code)
        exc.status = FAILED_STATUS.get(code, 500)
        return exc
    if response["status"] == "cancelled":
        exc = LMSPError(f"{response['id']} was cancelled (task {response['task']['id']})", code="cancelled")
        exc.status = 409
        return exc
    return None


class ChunkFraming(SseFraming):
    """A task's events as OpenAI's streamed chunks (``chat.completion.chunk`` or a
    streamed ``text_completion``), the usage chunk when asked, then ``[DONE]``.
    Errors are a ``data`` line with an ``error`` object, which OpenAI's clients raise."""

    def __init__(
        self,
        kind: Kind,
        created: dict[str, Any],
        *,
        include_usage: bool = False,
        echo: str = "",
        logprobs: bool = False,
        echo_pieces: tuple[bytes, ...] = (),
        calls: bool = False,
    ) -> None:
        self.kind = kind
        self.head = {
            "id": created["id"],
            "object": "chat.completion.chunk" if kind == "chat.completion" else "text_completion",
            "created": created["created_at"],
            "model": created["model"],
            "system_fingerprint": None,
        }
        self.include_usage = include_usage
        self.echo = echo
        self.logprobs = logprobs
        self.echo_pieces = echo_pieces
        # the model may answer with calls: the role chunk's content is null, as OpenAI's is
        # for a call (the answer's kind is not known yet; a text answer's deltas follow)
        self.calls = calls
        self.offsets = LegacyLogprobs()  # a text completion's text offsets so far

    def _logprobs(self, entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
        """A chunk's ``logprobs``: its tokens' (None: a chunk without tokens)."""
        if not self.logprobs or entries is None:
            return None
        if self.kind == "chat.completion":
            return chat_logprobs(entries)
        return self.offsets.generated(entries)

    def _chunk(
        self,
        delta: str | None,
        finish: str | None,
        *,
        role: bool = False,
        logprobs: dict[str, Any] | None = None,
        call: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if self.kind == "chat.completion":
            body: dict[str, Any] = {} if delta is None else {"content": delta}
            if call is not None:
                body = {"tool_calls": [call]}
            if role:
                body = {"role": "assistant", "content": None if self.calls else "", "refusal": None}
            choice = {"index": 0, "delta": body, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": logprobs, "finish_reason": finish}
        out = dict(self.head, choices=[choice])
        if self.include_usage:
            out["usage"] = None
        return out

    def event(self, event: dict[str, Any]) -> bytes:
        kind = event["type"]
        if kind == "response.created":
            if self.kind == "chat.completion":
                return data_frame(self._chunk(None, None, role=True))
            if not self.echo:
                return b""
            echoed = self.offsets.echoed(list(self.echo_pieces), self.echo) if self.logprobs else None
            return data_frame(self._chunk(self.echo, None, logprobs=echoed))
        if kind == "response.output_text.delta":
            entries = event.get("logprobs") or []
            if not event.get("delta") and not (self.logprobs and entries):
                return b""
            return data_frame(self._chunk(event.get("delta") or "", None, logprobs=self._logprobs(entries)))
        if self.kind == "chat.completion" and kind in CALL_EVENTS:
            return self._call_chunk(event)
        if self.kind == "chat.completion" and kind == "response.reasoning.delta" and event.get("delta"):
            chunk = self._chunk(None, None)
            chunk["choices"][0]["delta"] = {"reasoning_content": event["delta"]}
            return data_frame(chunk)
        if kind in ("response.completed", "response.incomplete"):
            response = event.get("response") or {}
            finish = finish_reason(response) or ("length" if kind == "response.incomplete" else "stop")
            out = data_frame(self._chunk(None, finish))
            if self.include_usage:
                out += data_frame(dict(self.head, choices=[], usage=usage(response)))
            return out + DONE
        if kind == "response.failed":
            error = (event.get("response") or {}).get("error") or {}
            return self.error(
                str(error.get("code") or "internal_error"), str(error.get("message") or "the task failed")
            )
        if kind == "response.cancelled":
            return self.error("cancelled", f"{self.head['id']} was cancelled")
        return b""

    def _call_chunk(self, event: dict[str, Any]) -> bytes:
        """A function call's opening (its id and name) or a piece of its arguments, as
        the chunk of a tool call's delta (its ``index``: the call's, in the output)."""
        index = int(event.get("output_index") or 0)
        if event["type"] == "response.function_call_arguments.delta":
            if not event.get("delta"):
                return b""
            call = {"index": index, "function": {"arguments": event["delta"]}}
            return data_frame(self._chunk(None, None, call=call))
        item = event.get("item") or {}
        if item.get("type") != "function_call":
            return b""
        return data_frame(self._chunk(None, None, call={"index": index, **tool_call(item, "")}))

    def error(self, code: str, message: str, param: str | None = None, sequence_number: int = 0) -> bytes:
        return data_frame({"error": {"code": code, "message": message, "param": param, "type": code}})

    def stopping(self, last: int) -> bytes:
        """The ``server_stopping`` error of a stream cut by the worker's stop. A chat
        completion or completion cannot be resumed: its chunks carry no event numbers,
        and its task's restart policy is ``fail``. So the client is told to send its
        request again, not offered a resume."""
        what = "chat completion" if self.kind == "chat.completion" else "completion"
        return self.error(
            "server_stopping",
            f"the service is stopping before {self.head['id']} finished; a {what} is not resumed "
            "after a restart (its restart policy is fail): send the request again",
        )


def embedding_list(model: str, vectors: list[list[float]], prompt_tokens: int, encoding: str) -> dict[str, Any]:
    """OpenAI's ``list`` of ``embedding`` objects; ``encoding``: ``float`` or ``base64``
    (the little-endian float32 bytes, as OpenAI sends them)."""
    data = []
    for i, vector in enumerate(vectors):
        value: Any = vector
        if encoding == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
