"""OpenAI's Chat Completions (LMSP B.11): ``POST /v1/chat/completions`` as a
task of the store, and the stored completions (``store: true``) read, listed
and deleted as in OpenAI's API.

Each resource parses (:mod:`lmsp.wire.chat`), makes one call to the task
service and writes the answer in OpenAI's shape (:mod:`lmsp.api.openai_shapes`).
"""

from __future__ import annotations

from typing import Any

import falcon

from lmsp import calls as call_format
from lmsp.errors import InvalidRequest, NotFound
from lmsp.service.keys import Answer
from lmsp.wire import chat_tools
from lmsp.wire.chat import PREFIX, parse_chat, parse_update
from lmsp.wire.metadata import parse_metadata
from lmsp.wire.openai import asked_logprobs

from . import idempotency, openai_answers
from .common import Deps, caller, owner_filter, query_int, query_str, request_caller, set_json
from .openai_shapes import ChunkFraming, chat_completion


def metadata_filter(req: falcon.Request) -> dict[str, str]:
    """The list's ``metadata[key]=value`` query parameters (OpenAI's filter), each pair
    one the listed completions' metadata must have."""
    wanted = {}
    for name in req.params:
        if not name.startswith("metadata"):
            continue
        key = name[len("metadata[") : -1] if name.startswith("metadata[") and name.endswith("]") else ""
        if not key:
            raise InvalidRequest("filter by metadata as metadata[key]=value", param=name)
        wanted[key] = query_str(req, name) or ""
    return parse_metadata(wanted) if wanted else {}


def check_chat_id(value: str) -> str:
    if not value.startswith(PREFIX) or len(value) > 100:
        raise NotFound(f"no chat completion with id {value!r}")
    return value


def stored_completion(
    deps: Deps, completion_id: str, req: falcon.Request, response: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A stored chat completion (``response``: its Response object, when read already),
    with the log probabilities its request asked for."""
    owner = owner_filter(req)
    if response is None:
        response = deps.tasks.response(completion_id, owner)
    try:
        asked = asked_logprobs(deps.tasks.request(completion_id, owner))
    except NotFound:  # a listed one deleted since the list was read: shown as it was read
        asked = False
    return chat_completion(response, asked)


class ChatCompletionsResource:
    """``POST /v1/chat/completions`` and the list of stored ones (``GET``)."""

    scopes = {"POST": "responses:write", "GET": "responses:read"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        deps = self.deps
        body = deps.body(req)
        parsed = parse_chat(body, deps.config, deps.random_seed)
        usage = bool(parsed.request["include_usage"])
        logprobs = asked_logprobs(parsed.request)
        calls = call_format.mode(parsed.request) is not None

        def framing(created: dict[str, Any]) -> ChunkFraming:
            return ChunkFraming("chat.completion", created, include_usage=usage, logprobs=logprobs, calls=calls)

        who = request_caller(req)
        try:
            delivery = deps.tasks.submit(who, parsed, idempotency.create_key(req, who.client_id, body), framing)
        except InvalidRequest as exc:  # the runtime's refusal of a schema, named as this request names it
            raise chat_tools.chat_param(exc) from None
        openai_answers.write(resp, delivery, lambda response: chat_completion(response, logprobs))

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        limit = query_int(req, "limit", default=20, minimum=1, maximum=100)
        order = query_str(req, "order", choices=("asc", "desc")) or "asc"
        after = query_str(req, "after")
        if after is not None and not after.startswith(PREFIX):
            raise InvalidRequest(f"'after' must be an id starting with {PREFIX}", param="after")
        page = self.deps.tasks.responses(
            owner_filter(req),
            limit=limit,
            after=after,
            prefix=PREFIX,
            model=query_str(req, "model"),
            oldest_first=order == "asc",
            metadata=metadata_filter(req),
        )
        page["data"] = [stored_completion(self.deps, r["id"], req, r) for r in page["data"]]
        set_json(resp, page)


class ChatCompletionResource:
    """``GET``, ``POST`` (OpenAI's update: its ``metadata``) and ``DELETE
    /v1/chat/completions/{id}``."""

    scopes = {"GET": "responses:read", "POST": "responses:write", "DELETE": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, completion_id: str) -> None:
        check_chat_id(completion_id)
        set_json(resp, stored_completion(self.deps, completion_id, req))

    def on_post(self, req: falcon.Request, resp: falcon.Response, completion_id: str) -> None:
        check_chat_id(completion_id)
        body = self.deps.body(req)
        metadata = parse_update(body)

        def update() -> Answer:
            self.deps.tasks.update_metadata(completion_id, metadata, owner_filter(req))
            return 200, stored_completion(self.deps, completion_id, req)

        # an Idempotency-Key keeps the answer for a retry (B.8)
        idempotency.answer(self.deps.keys, req, resp, caller(req)["id"], body, update)

    def on_delete(self, req: falcon.Request, resp: falcon.Response, completion_id: str) -> None:
        check_chat_id(completion_id)
        self.deps.tasks.delete_response(completion_id, owner_filter(req))
        set_json(resp, {"id": completion_id, "object": "chat.completion.deleted", "deleted": True})


class ChatCompletionMessagesResource:
    """``GET /v1/chat/completions/{id}/messages``: a stored completion's messages as
    OpenAI lists them (each content one text, an assistant's ``tool_calls``, a tool
    message's ``tool_call_id``), oldest first unless ``order=desc``."""

    scopes = {"GET": "responses:read"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, completion_id: str) -> None:
        check_chat_id(completion_id)
        limit = query_int(req, "limit", default=20, minimum=1, maximum=100)
        order = query_str(req, "order", choices=("asc", "desc")) or "asc"
        after = query_str(req, "after")
        request = self.deps.tasks.request(completion_id, owner_filter(req))
        given = request.get("chat_messages") or request.get("input") or []  # input: kept before calls were
        messages = [{"id": f"{completion_id}-{i}", **m, "content_parts": None} for i, m in enumerate(given)]
        if order == "desc":
            messages.reverse()
        ids = [m["id"] for m in messages]
        if after is not None:
            if after not in ids:
                raise InvalidRequest("'after' must be the id of one of the completion's messages", param="after")
            messages = messages[ids.index(after) + 1 :]
        data = messages[:limit]
        set_json(
            resp,
            {
                "object": "list",
                "data": data,
                "has_more": len(messages) > limit,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
            },
        )
