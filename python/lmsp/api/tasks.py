"""Tasks and their event logs (LMSP B.6)."""

from __future__ import annotations

import falcon

from . import idempotency
from lmsp.service.keys import Answer

from .common import (
    Deps,
    caller,
    check_cursor,
    check_id,
    owner_filter,
    query_bool,
    query_int,
    query_str,
    set_json,
    stream_start,
)
from .events import SSE_FRAMES, start_sse, wants_sse

TASK_STATUSES = ("queued", "loading", "running", "cancelling", "completed", "failed", "cancelled")


class TasksResource:
    scopes = {"GET": "responses:read"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        status = query_str(req, "status", choices=TASK_STATUSES)
        limit = query_int(req, "limit", default=20, minimum=1, maximum=100)
        after = query_str(req, "after")
        if after is not None:
            check_cursor(after, "task")
        set_json(resp, self.deps.tasks.tasks(owner_filter(req), status=status, limit=limit, after=after))


class TaskResource:
    scopes = {"GET": "responses:read"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, task_id: str) -> None:
        check_id(task_id, "task", "task")
        set_json(resp, self.deps.tasks.task(task_id, owner_filter(req)))


class TaskCancelResource:
    """``POST /v1/tasks/{id}/cancel``: B.7; answers the Task object."""

    scopes = {"POST": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_post(self, req: falcon.Request, resp: falcon.Response, task_id: str) -> None:
        check_id(task_id, "task", "task")
        body = self.deps.no_body(req)
        owner = owner_filter(req)

        def act() -> Answer:
            return 200, self.deps.tasks.cancel(task_id, owner)

        idempotency.answer(self.deps.keys, req, resp, caller(req)["id"], body, act)


class TaskEventsResource:
    """``GET /v1/tasks/{id}/events?after=N``: a JSON page, or SSE when asked for."""

    scopes = {"GET": "responses:read"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, task_id: str) -> None:
        check_id(task_id, "task", "task")
        owner, tasks = owner_filter(req), self.deps.tasks
        if wants_sse(req) or query_bool(req, "stream"):
            after = stream_start(req, "after")
            tasks.task(task_id, owner)  # 404 before the stream starts
            stream = tasks.stream(
                task_id, owner, framing=SSE_FRAMES, after=after, caller_id=caller(req)["id"], task_events=True
            )
            start_sse(resp, stream)
            return
        after = stream_start(req, "after")
        limit = query_int(req, "limit", default=100, minimum=1, maximum=1000)
        set_json(resp, tasks.events(task_id, owner, after=after, limit=limit))
