"""How OpenAI's endpoints answer a task's delivery: the stream of its chunks, or
OpenAI's object once the task has finished; a task that failed or was
cancelled as an error (OpenAI's endpoints have no such objects)."""

from __future__ import annotations

from typing import Any, Callable

import falcon

from lmsp.service.tasks import Delivery

from .common import set_json
from .events import start_sse
from .idempotency import replayed_header
from .openai_shapes import ended_error

Render = Callable[[dict[str, Any]], dict[str, Any]]  # a Response object -> OpenAI's object


def answer(response: dict[str, Any], render: Render) -> dict[str, Any]:
    """OpenAI's object of a finished response; the error of one that failed or was cancelled."""
    error = ended_error(response)
    if error is not None:
        raise error
    return render(response)


def write(resp: falcon.Response, delivery: Delivery, render: Render) -> None:
    """Write the delivery: its stream, or its object in OpenAI's shape (a recorded answer
    that is not a Response object, an error, as it was recorded)."""
    headers = replayed_header(delivery.replayed)
    if delivery.frames is not None:
        start_sse(resp, delivery.frames, headers=headers)
        return
    body = delivery.body
    assert body is not None
    if not delivery.stored or body.get("object") == "response":
        body = answer(body, render)
    set_json(resp, body, delivery.status, headers)


def finals(responses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Finished responses; the error of the first that failed or was cancelled."""
    for response in responses:
        error = ended_error(response)
        if error is not None:
            raise error
    return responses
