"""Responses (LMSP B.5): create (plain, stream, background), retrieve, stream
resume, cancel, delete and list.

Each resource parses (:mod:`lmsp.wire.responses`), makes one call to the task
service (:mod:`lmsp.service.tasks`) and writes the answer.
"""

from __future__ import annotations

from typing import get_args

import falcon

from lmsp.service.keys import Answer
from lmsp.service.tasks import Delivery
from lmsp.wire.answers import ResponseStatus
from lmsp.wire.responses import parse_create

from . import idempotency
from .common import (
    Deps,
    caller,
    check_cursor,
    check_id,
    owner_filter,
    query_bool,
    query_int,
    query_str,
    request_caller,
    set_json,
    stream_start,
)
from .events import SSE_FRAMES, start_sse

RESPONSE_STATUSES: tuple[str, ...] = get_args(ResponseStatus)


class ResponsesResource:
    """``POST /v1/responses`` and ``GET /v1/responses``."""

    scopes = {"POST": "responses:write", "GET": "responses:read"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        deps, who = self.deps, request_caller(req)
        body = deps.body(req)
        key = idempotency.create_key(req, who.client_id, body)
        earlier = deps.tasks.earlier_turns(who.client_id, body, key)
        parsed = parse_create(body, deps.config, deps.random_seed, earlier)
        delivery = deps.tasks.submit(who, parsed, key, lambda _: SSE_FRAMES, replay=earlier.replay)
        write(resp, delivery, background=parsed.background)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        status = query_str(req, "status", choices=RESPONSE_STATUSES)
        limit = query_int(req, "limit", default=20, minimum=1, maximum=100)
        after = query_str(req, "after")
        if after is not None:
            check_cursor(after, "resp")
        set_json(resp, self.deps.tasks.responses(owner_filter(req), status=status, limit=limit, after=after))


def write(resp: falcon.Response, delivery: Delivery, *, background: bool) -> None:
    """A delivery as B.5 answers it: the stream, the Response object (202 with its
    ``Location`` for a background one), or a replayed key's recorded answer (the final
    Response object, or the error, as JSON: there is no stream to replay)."""
    headers = idempotency.replayed_header(delivery.replayed) or {}
    if delivery.stored:
        set_json(resp, delivery.body, delivery.status, headers)
        return
    location = {"Location": f"/v1/responses/{delivery.response_id}"}
    if delivery.frames is not None:
        start_sse(resp, delivery.frames, headers={**headers, **location} if delivery.replayed or background else None)
        return
    set_json(resp, delivery.body, delivery.status, {**headers, **location} if delivery.status == 202 else headers)


class ResponseResource:
    """``GET`` (JSON, or SSE with ``?stream=true``) and ``DELETE /v1/responses/{id}``."""

    scopes = {"GET": "responses:read", "DELETE": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, response_id: str) -> None:
        check_id(response_id, "resp", "response")
        owner, tasks = owner_filter(req), self.deps.tasks
        if not query_bool(req, "stream"):
            set_json(resp, tasks.response(response_id, owner))
            return
        after = stream_start(req, "starting_after")
        task_id = tasks.response_task(response_id, owner)
        start_sse(resp, tasks.stream(task_id, owner, framing=SSE_FRAMES, after=after, caller_id=caller(req)["id"]))

    def on_delete(self, req: falcon.Request, resp: falcon.Response, response_id: str) -> None:
        check_id(response_id, "resp", "response")
        set_json(resp, self.deps.tasks.delete_response(response_id, owner_filter(req)))


class ResponseCancelResource:
    """``POST /v1/responses/{id}/cancel``: B.7; answers the Response object."""

    scopes = {"POST": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_post(self, req: falcon.Request, resp: falcon.Response, response_id: str) -> None:
        check_id(response_id, "resp", "response")
        body = self.deps.no_body(req)
        owner, tasks = owner_filter(req), self.deps.tasks

        def act() -> Answer:
            tasks.cancel(response_id, owner)
            return 200, tasks.response(response_id, owner)

        idempotency.answer(self.deps.keys, req, resp, caller(req)["id"], body, act)
