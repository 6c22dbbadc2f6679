"""What ``POST /v1/chat/completions`` and ``POST /v1/completions`` share: each
request is a task of the store, created by the Responses machinery
(:class:`~lmsp.api.responses.ResponsesService`: idempotency, the client's cap,
the model's checks), streamed from its event log as OpenAI's chunks or waited
for, and answered in OpenAI's shape. Their restart policy is ``fail``: the
client that waits for the answer is gone after a restart.
"""

from __future__ import annotations

from typing import Any, Callable

import falcon

from lmsp.auth import is_admin

from . import idempotency
from .common import Deps, caller, set_json
from .events import start_sse
from .openai_shapes import ChunkFraming, ended_error
from .responses import CreateRequest, ResponsesService

ON_RESTART = "fail"

Render = Callable[[dict[str, Any]], dict[str, Any]]  # a Response object -> OpenAI's object
Frames = Callable[[dict[str, Any]], ChunkFraming]  # the created Response object -> its stream's framing


def answer(response: dict[str, Any], render: Render) -> dict[str, Any]:
    """OpenAI's object of a finished response; the error of one that failed or was cancelled."""
    error = ended_error(response)
    if error is not None:
        raise error
    return render(response)


def _replayed() -> dict[str, str]:
    return {idempotency.REPLAYED: "true"}


def post_task(
    deps: Deps,
    service: ResponsesService,
    req: falcon.Request,
    resp: falcon.Response,
    body: dict[str, Any],
    parsed: CreateRequest,
    render: Render,
    frames: Frames,
) -> None:
    """Create the request's task (or replay its ``Idempotency-Key``) and answer: the
    stream of its chunks, or OpenAI's object once the task has finished. A stream
    whose client leaves cancels its task; ``store: false`` deletes the response once
    it was delivered."""
    client_id = caller(req)["id"]
    key = idempotency.key_of(req)
    idem = None if key is None else (key, idempotency.fingerprint(client_id, req.method, req.path, body))
    result = service.create(client_id, parsed, idem, limited=not is_admin(caller(req)))
    replay = result.get("replay")
    if replay is not None and result.get("task") is None:
        # the key's response is gone: its stored answer, the final object or an error
        status, stored = replay
        set_json(resp, answer(stored, render) if stored.get("object") == "response" else stored, status, _replayed())
        return
    response = result["response"] if replay is None else replay[1]
    assert response is not None
    response_id, task_id = response["id"], response["task"]["id"]
    if replay is not None:
        if parsed.stream:
            start_sse(
                resp,
                service.stream(task_id, client_id, caller_id=client_id, framing=frames(response)),
                headers=_replayed(),
            )
        else:
            set_json(resp, answer(replay[1], render), replay[0], _replayed())
        return
    if parsed.stream:
        stream = service.stream(
            task_id,
            client_id,
            cancel_on_abandon=True,
            forget_response=None if parsed.store else response_id,
            caller_id=client_id,
            framing=frames(response),
        )
        start_sse(resp, stream)
        return
    service.wait_finished(task_id, client_id)
    final = deps.store.get_response(response_id, client_id)
    if not parsed.store:
        service.forget(response_id, client_id)
    set_json(resp, answer(final, render))


def post_together(
    deps: Deps, service: ResponsesService, req: falcon.Request, every: list[CreateRequest]
) -> list[dict[str, Any]]:
    """Create a task per request (``store: false`` each), wait for all of them, and
    return their final Response objects in order, each deleted once read; the error
    of the first that failed or was cancelled. A creation refused midway cancels the
    tasks created before it."""
    client_id = caller(req)["id"]
    limited = not is_admin(caller(req))
    made: list[dict[str, Any]] = []
    try:
        for parsed in every:
            response = service.create(client_id, parsed, None, limited=limited)["response"]
            assert response is not None  # a new task (no idempotency key)
            made.append(response)
    except BaseException:
        for response in made:
            service.abandon(response["task"]["id"], client_id)
            service.forget_when_finished(response["task"]["id"], response["id"], client_id)
        raise
    finals = []
    for response in made:
        service.wait_finished(response["task"]["id"], client_id)
        finals.append(deps.store.get_response(response["id"], client_id))
        service.forget(response["id"], client_id)
    for final in finals:
        error = ended_error(final)
        if error is not None:
            raise error
    return finals
