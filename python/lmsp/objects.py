"""Rendering of store rows to the JSON objects of LMSP (B.2, B.4, B.5, B.6).

Every function takes rows (``sqlite3.Row`` or mappings with the column names
of :mod:`lmsp.store.schema`) and returns plain JSON-ready dicts. Times are
Unix seconds as integers.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Mapping

from . import calls

Row = Mapping[str, Any] | sqlite3.Row

COMPLETED, FAILED, CANCELLED = "completed", "failed", "cancelled"
#: a task's ``item_open`` once its output is on the chat layer (lmsp.items.chat), kept
#: after its items end; CHAT_THINK for a model that thinks
CHAT_OPEN, CHAT_THINK = 3, 4
DELTA = "response.output_text.delta"  # the event stored compactly: its text (and log probabilities)
LOGPROBS = "message.output_text.logprobs"  # the include value that asks for log probabilities


def wants_logprobs(request: Mapping[str, Any]) -> bool:
    """Whether a request's output carries log probabilities: ``include`` asks for them,
    or ``top_logprobs`` for alternatives."""
    return LOGPROBS in (request.get("include") or ()) or bool(request.get("top_logprobs"))


def response_status(task_status: str, incomplete_reason: str | None) -> str:
    """The Response object's status derived from its task's (B.6)."""
    if task_status == "queued":
        return "queued"
    if task_status in ("loading", "running", "cancelling"):
        return "in_progress"
    if task_status == COMPLETED:
        return "incomplete" if incomplete_reason else "completed"
    return task_status


def ts(value: float | None) -> int | None:
    return None if value is None else int(value)


def _json(value: str | None, default=None):
    return default if value is None else json.loads(value)


def task_object(task: Row) -> dict:
    return {
        "id": task["id"],
        "object": "task",
        "response_id": task["response_id"],
        "client_id": task["client_id"],
        "model": task["model"],
        "status": task["status"],
        "on_restart": task["on_restart"],
        "attempts": task["attempts"],
        "created_at": ts(task["created_at"]),
        "started_at": ts(task["started_at"]),
        "finished_at": ts(task["finished_at"]),
        "error": _json(task["error"]),
        "last_sequence_number": task["last_seq"],
    }


def _item_status(task: Row, incomplete_reason: str | None) -> str:
    if task["status"] == COMPLETED:
        return "incomplete" if incomplete_reason else "completed"
    if task["status"] in (FAILED, CANCELLED):
        return "incomplete"
    return "in_progress"


def output_part(text: str, logprobs: list | None = None) -> dict:
    """An ``output_text`` content part; ``logprobs`` as the request asked for them ([]: none)."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def output_item(item_id: str, status: str, text: str | None, logprobs: list | None = None) -> dict:
    content = [] if text is None else [output_part(text, logprobs)]
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


# what a Response object echoes of its request (Open Responses' ResponseResource), with
# the value each field has when the request did not set it (OpenAI's defaults)
ECHOED: dict[str, Any] = {
    "previous_response_id": None,
    "conversation": None,
    "instructions": None,
    "tools": [],
    "tool_choice": "auto",
    "truncation": "disabled",
    "parallel_tool_calls": True,
    "text": {"format": {"type": "text"}, "verbosity": "medium"},
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "top_logprobs": 0,
    "reasoning": {"effort": None, "summary": None},
    "max_tool_calls": None,
    "service_tier": "default",
    "safety_identifier": None,
    "prompt_cache_key": None,
    "user": None,
}


def echoed(request: Mapping[str, Any], thinks: bool = False) -> dict:
    """The request's echoed fields, each as asked or at its default; ``reasoning`` as
    asked only where a model that thinks made the output (``thinks``)."""
    out = {}
    for name, default in ECHOED.items():
        value = request.get(name) if name != "reasoning" or thinks else None
        out[name] = json.loads(json.dumps(default)) if value is None else value
    fmt = out["text"].get("format") or {}
    if fmt.get("type") == "json_schema":  # Open Responses echoes the format without its schema
        out["text"] = {**out["text"], "format": {**fmt, "schema": None}}
    return out


def response_object(response: Row, task: Row, text: str | None, logprobs: list | None = None) -> dict:
    """The Response object; ``text`` is the output of the current attempt (None: none yet),
    ``logprobs`` its log probabilities (for a request that asked for them)."""
    request = _json(response["request"], {})
    reason = response["incomplete_reason"]
    output = []
    made = calls.split_all(text or "") if calls.mode(request) else []
    for index, (name, arguments) in enumerate(made):  # each call done but the last
        status = _item_status(task, reason) if index == len(made) - 1 else "completed"
        output.append(calls.call_item(response["item_id"], name, arguments, status, index))
    if not made and (text or task["item_open"] or task["status"] == COMPLETED):
        output.append(output_item(response["item_id"], _item_status(task, reason), text or "", logprobs))
    usage = _json(response["usage"])
    if usage is not None:
        cached = int(usage.get("cached_tokens", 0))
        usage = {
            "input_tokens": int(usage.get("input_tokens", 0)),
            # written to the cache: the input tokens computed for this response, which its
            # sequence's slot keeps (a later prompt that starts with them reuses them)
            "input_tokens_details": {
                "cached_tokens": cached,
                "cache_write_tokens": max(0, int(usage.get("input_tokens", 0)) - cached),
            },
            "output_tokens": int(usage.get("output_tokens", 0)),
            "output_tokens_details": {"reasoning_tokens": int(usage.get("reasoning_tokens", 0))},
        }
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
    status = response_status(task["status"], reason)
    return {
        "id": response["id"],
        "object": "response",
        "created_at": ts(response["created_at"]),
        "completed_at": ts(task["finished_at"]) if status == COMPLETED else None,
        "status": status,
        "background": bool(response["background"]),
        "model": response["model"],
        "output": output,
        "usage": usage,
        "error": _json(task["error"]) if task["status"] == FAILED else None,
        "incomplete_details": {"reason": reason} if reason and task["status"] == COMPLETED else None,
        "max_output_tokens": request.get("max_output_tokens"),
        "temperature": request.get("temperature", 1.0),
        "top_p": request.get("top_p", 1.0),
        "seed": request.get("seed"),
        "metadata": request.get("metadata") or {},
        "store": bool(request.get("store", True)),
        **echoed(request, task["item_open"] == CHAT_THINK),
        "task": {"id": task["id"], "status": task["status"], "on_restart": task["on_restart"]},
    }


def event_object(event: Row, item_id: str) -> dict:
    """One task event: ``{"type", "sequence_number", "created_at", ...payload}``."""
    out = {"type": event["type"], "sequence_number": event["seq"], "created_at": ts(event["created_at"])}
    data = event["data"]
    # stored compactly: its text, and its log probabilities in data (an output on the
    # chat layer keeps the whole payload in data, lmsp.items.chat)
    if event["type"] == DELTA and (data is None or data.startswith('{"logprobs"')):
        logprobs = json.loads(data).get("logprobs", []) if data is not None else []
        out.update(item_id=item_id, output_index=0, content_index=0, delta=event["text"] or "", logprobs=logprobs)
    else:
        out.update(json.loads(event["data"]))
        if out["type"] == "response.failed":  # rows written before B.6 said so kept the error here too
            out.pop("error", None)
    return out


def model_object(model: Row, *, with_path: bool = False) -> dict:
    out = {
        "id": model["id"],
        "object": "model",
        "created": ts(model["created_at"]),
        "owned_by": "local",
        "digest": model["digest"],
        "size_bytes": model["size_bytes"],
        "format": model["format"],
        "architecture": model["architecture"],
        "parameters": model["parameters"],
        "quantization": model["quantization"],
        "context_length": model["context_length"],
        "state": model["state"],
        # None: registered before this was recorded (the registry reads the file)
        "has_chat_template": None if model["chat_template"] is None else bool(model["chat_template"]),
    }
    if with_path:
        out["path"] = model["path"]
        # {"servers": [HOST:PORT], "tensor_split": [share]}; None: the service's setting
        out["rpc_split"] = json.loads(model["rpc_split"]) if model["rpc_split"] else None
    return out


def public_model(model: dict) -> dict:
    """A model dict from the store without its file path or its RPC split (the Model object
    shows its servers' states instead), for clients."""
    return {k: v for k, v in model.items() if k not in ("path", "rpc_split")}


def client_object(client: Row) -> dict:
    return {
        "id": client["id"],
        "object": "client",
        "name": client["name"],
        "scopes": json.loads(client["scopes"]),
        "created_at": ts(client["created_at"]),
        "revoked_at": ts(client["revoked_at"]),
        "priority": client["priority"],
        "max_running": client["max_running"],
        "max_queued": client["max_queued"],
        "tokens_per_hour": client["tokens_per_hour"],
        "last_seen_at": ts(client["last_seen_at"]),
    }


def pairing_object(pairing: Row) -> dict:
    return {
        "id": pairing["id"],
        "object": "pairing",
        "name": pairing["name"],
        "scopes": json.loads(pairing["scopes"]),
        "created_at": ts(pairing["created_at"]),
        "expires_at": ts(pairing["expires_at"]),
        "used_at": ts(pairing["used_at"]),
    }


def deleted_response(response_id: str) -> dict:
    return {"id": response_id, "object": "response", "deleted": True}
