"""Responses (LMSP B.5): create (plain, stream, background), retrieve, stream
resume, cancel, delete and list.

:func:`parse_create` and :class:`ResponsesService` hold the logic and know
nothing of HTTP; the resources below them only read the request and write the
answer.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import falcon

from lmsp import history
from lmsp.auth import is_admin
from lmsp.contracts import CreatedTask, NewTask
from lmsp.errors import InvalidRequest, LMSPError, ModelChanged, NotFound, TaskFinished, Unavailable
from lmsp.errors import ModelNotGenerative
from lmsp.store.states import FINISHED

from lmsp.ids import new_id
from lmsp.items import input_items

from . import context, idempotency, response_options, tools
from .context import NO_CONTEXT, Context
from .forgetting import Forgetter
from .common import (
    Deps,
    caller,
    check_id,
    get_bool,
    get_int,
    get_number,
    get_str,
    header_int,
    owner_filter,
    query_bool,
    query_int,
    query_str,
    reject_unknown,
    set_json,
)
from .metadata import parse_metadata as parse_metadata  # chat.py takes it from here
from .events import POLL_SECONDS, SSE_FRAMES, Framing, event_stream, start_sse

log = logging.getLogger("lmsp.api")

FIELDS = (
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "background",
    "store",
    "on_restart",
    "metadata",
    *response_options.FIELDS,
    *tools.FIELDS,
)
ROLES = ("system", "user", "assistant")
ROLE_ALIASES = {"developer": "system"}  # the OpenAI name of a system message
TEXT_PART_TYPES = ("input_text", "output_text", "text")
MEDIA_PART_TYPES = ("input_image", "input_file", "input_audio", "input_video")
REASONING_FIELDS = ("type", "id", "summary", "content", "encrypted_content", "status")
RESTART_POLICIES = ("fail", "retry", "resume")
RESPONSE_STATUSES = ("queued", "in_progress", "completed", "incomplete", "failed", "cancelled")
SEED_MAX = 2**32 - 2  # 2**32 - 1 is llama.cpp's "pick one at random"
MAX_MESSAGES = 10_000
MAX_TEXT = 4_000_000  # characters in one message; the body cap comes first anyway
MAX_STOP = 16
FORGET_WAIT_SECONDS = 600.0  # how long a store:false response whose client left waits for its task to end
WATCHED_WAIT_SECONDS = 5.0  # a wait the runtime ends when the task moves; the time-out is a fallback
STOPPING_RETRY_AFTER = 5  # Retry-After of a plain request whose task outlives the worker's stop


@dataclass(frozen=True)
class CreateRequest(NewTask):
    """A request of B.5 as checked: the task to create (its client and its creation's
    options are the caller's, set by :meth:`ResponsesService.create`), and ``store``."""

    store: bool = True


def _part_text(part: dict[str, Any], where: str) -> str:
    """One content part's text: text parts as the SDKs send and echo them (an output's
    annotations and logprobs included), a refusal's words; media is refused."""
    kind = part.get("type")
    if kind in MEDIA_PART_TYPES:
        raise InvalidRequest(
            f"{where}.type {kind!r} is not supported: the models of this service have no projector"
            " for images, audio, video or files",
            param=f"{where}.type",
        )
    if kind == "refusal":
        reject_unknown(part, ("type", "refusal"), where=f"{where}.")
        return str(
            get_str(part, "refusal", required=True, allow_empty=True, max_len=MAX_TEXT, param=f"{where}.refusal")
        )
    if kind not in TEXT_PART_TYPES:
        raise InvalidRequest(
            f"{where}.type must be one of {', '.join(TEXT_PART_TYPES)}; only text content is supported",
            param=f"{where}.type",
        )
    reject_unknown(part, ("type", "text", "annotations", "logprobs"), where=f"{where}.")
    _check_types(part, {"annotations": list, "logprobs": list}, where)
    return str(get_str(part, "text", required=True, allow_empty=True, max_len=MAX_TEXT, param=f"{where}.text"))


def _check_types(item: dict[str, Any], types: dict[str, type], where: str) -> None:
    """The optional fields of an input item or part that must be null or of a type."""
    for name, kind in types.items():
        value = item.get(name)
        if value is not None and not isinstance(value, kind):
            what = "a string" if kind is str else "an array"
            raise InvalidRequest(f"{where}.{name} must be {what} or null", param=f"{where}.{name}")


def _content_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            where = f"{param}[{j}]"
            if not isinstance(part, dict):
                raise InvalidRequest(f"{where!r} must be an object", param=where)
            texts.append(_part_text(part, where))
        return "".join(texts)
    raise InvalidRequest(f"{param!r} must be a string or an array of text parts", param=param)


def _check_nul(text: str, param: str) -> str:
    if "\x00" in text:  # no chat template or tokenizer takes it
        raise InvalidRequest(f"{param!r} must not contain NUL characters", param=param)
    return text


def parse_messages(value: Any, calls: dict[str, str] | None = None) -> list[dict[str, str]]:
    """``input``: a string (one user message) or a list of messages; ``calls``: the
    function calls so far (call id -> name), those of the input added."""
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise InvalidRequest(f"'input' is longer than {MAX_TEXT} characters", param="input")
        return [{"role": "user", "content": _check_nul(value, "input")}]
    if not isinstance(value, list):
        raise InvalidRequest("'input' must be a string or an array of messages", param="input")
    if not value:
        raise InvalidRequest("'input' must not be an empty array", param="input")
    if len(value) > MAX_MESSAGES:
        raise InvalidRequest(f"'input' has more than {MAX_MESSAGES} messages", param="input")
    messages = []
    calls = {} if calls is None else calls
    for i, item in enumerate(value):
        message = input_item(item, f"input[{i}]", calls)
        if message is not None:
            messages.append(message)
    if all(history.is_reasoning(m) for m in messages):
        raise InvalidRequest("'input' has no message", param="input")
    return messages


def input_item(item: Any, where: str, calls: dict[str, str]) -> dict[str, str] | None:
    """One input item: a message as the prompt takes it, or None for an item that adds
    nothing to the prompt (a reasoning item without its text);
    ``calls`` maps the call ids of the function calls so far to their names."""
    if not isinstance(item, dict):
        raise InvalidRequest(f"{where} must be an object with 'role' and 'content'", param=where)
    kind = item.get("type", "message")
    if kind in tools.CALL_ITEMS:
        return tools.call_message(item, where, calls)
    if kind == "reasoning":  # the model's earlier thinking: for a template that shows it again
        reject_unknown(item, REASONING_FIELDS, where=f"{where}.")
        _check_types(
            item, {"id": str, "summary": list, "content": list, "encrypted_content": str, "status": str}, where
        )
        text = _check_nul(history.reasoning_text(item), f"{where}.content")
        return history.reasoning_message(text) if text else None  # a summary only, or encrypted: nothing
    if kind != "message":
        raise InvalidRequest(
            f"{where}.type must be 'message', 'reasoning', 'function_call' or 'function_call_output';"
            " other input items are not supported",
            param=f"{where}.type",
        )
    # id, status and phase: what the SDKs echo of an output message; nothing of the prompt
    reject_unknown(item, ("role", "content", "type", "id", "status", "phase"), where=f"{where}.")
    get_str(item, "id", max_len=256, allow_empty=True, param=f"{where}.id")
    _check_types(item, {"status": str, "phase": str}, where)
    role = item.get("role")
    role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
    if role not in ROLES:
        raise InvalidRequest(f"{where}.role must be one of {', '.join(ROLES)}", param=f"{where}.role")
    if "content" not in item or item["content"] is None:
        raise InvalidRequest(f"{where}.content is required", param=f"{where}.content")
    text = _content_text(item["content"], f"{where}.content")
    return {"role": role, "content": _check_nul(text, f"{where}.content")}


def parse_stop(value: Any) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise InvalidRequest("'stop' must be a string or an array of strings", param="stop")
    if len(items) > MAX_STOP:
        raise InvalidRequest(f"'stop' has more than {MAX_STOP} strings", param="stop")
    for s in items:
        if not isinstance(s, str) or not s or len(s) > 1000:
            raise InvalidRequest(
                "each stop sequence must be a non-empty string of at most 1000 characters", param="stop"
            )
    return list(items)


def parse_create(
    body: dict[str, Any], config: Any, random_seed: Callable[[], int], earlier: Context = NO_CONTEXT
) -> CreateRequest:
    """Check every field of B.5 and fill the defaults (``earlier``: the turns it continues)."""
    reject_unknown(body, FIELDS)
    model = get_str(body, "model", required=True, max_len=256)
    if "input" not in body or body["input"] is None:
        raise InvalidRequest("'input' is required", param="input")
    calls = earlier.calls if earlier.replay is not None else dict(earlier.calls)  # those of the input added
    messages = parse_messages(body["input"], calls)
    # what the task keeps of the input: the messages as checked, each content one text
    given = body["input"] if isinstance(body["input"], str) else [dict(m) for m in messages]
    messages = earlier.messages + messages
    instructions = get_str(body, "instructions", allow_empty=True, max_len=MAX_TEXT)
    if instructions is not None:  # an empty one is an empty system message
        _check_nul(instructions, "instructions")
        messages.insert(0, {"role": "system", "content": instructions})
    max_output = get_int(body, "max_output_tokens", default=config.max_output_tokens, minimum=1)
    max_output = min(max_output, config.max_output_tokens_cap)
    seed = get_int(body, "seed", minimum=0, maximum=SEED_MAX)
    background = get_bool(body, "background")
    stream = get_bool(body, "stream")
    store = get_bool(body, "store", default=True)
    if background and not store:
        raise InvalidRequest("a background response must be stored ('store' cannot be false)", param="store")
    on_restart = get_str(body, "on_restart", default=config.default_on_restart)
    if on_restart not in RESTART_POLICIES:
        raise InvalidRequest(f"'on_restart' must be one of {', '.join(RESTART_POLICIES)}", param="on_restart")
    request = {
        "model": model,
        "input": given,
        "instructions": instructions,
        "max_output_tokens": max_output,
        "temperature": get_number(body, "temperature", default=1.0, minimum=0, maximum=2),
        "top_p": get_number(body, "top_p", default=1.0, exclusive_minimum=0, maximum=1),
        "top_k": get_int(body, "top_k", default=0, minimum=0, maximum=2**31 - 1),
        "seed": random_seed() if seed is None else seed,
        "stop": parse_stop(body.get("stop")),
        "stream": stream,
        "background": background,
        "store": store,
        "on_restart": on_restart,
        "metadata": parse_metadata(body.get("metadata")),
        **response_options.parse_options(body),
        **tools.tools_and_format(body),
        **earlier.fields(calls),
    }
    return CreateRequest(
        client_id=None,
        model=model,
        messages=messages,
        request=request,
        on_restart=on_restart,
        background=background,
        stream=stream,
        store=store,
        items=input_items(body["input"], new_id),
        conversation=earlier.conversation,
    )


class ResponsesService:
    """Creating, waiting for and cancelling responses, without HTTP."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.forgetter = Forgetter(deps.store)

    def create(
        self,
        client_id: str,
        parsed: CreateRequest,
        idempotency_key: tuple[str, str] | None = None,
        *,
        limited: bool = True,
    ) -> CreatedTask:
        """``limited``: the client's unfinished tasks are capped (``max_unfinished_per_client``;
        an admin's are not)."""
        model = self.check_serving(parsed.model)
        if "generation" not in model.get("capabilities", ("generation",)):
            raise ModelNotGenerative(
                f"model {parsed.model!r} is an embedding model: it makes no text (use POST /v1/embeddings)",
                param="model",
            )
        cap = (self.deps.config.max_unfinished_per_client or None) if limited else None
        return self.deps.runtime.create_task(
            replace(parsed, client_id=client_id, idempotency=idempotency_key, max_unfinished=cap)
        )

    def check_serving(self, model_id: str) -> dict[str, Any]:
        """The model's object. Unavailable while the worker starts or stops; NotFound for a
        model that is not registered, ModelChanged for one whose file changed or is missing."""
        runtime = self.deps.runtime
        if not runtime.ready or runtime.draining:
            raise Unavailable("the service is starting or shutting down; retry shortly", retry_after=1)
        try:
            model = runtime.model_object(model_id)
        except NotFound:
            raise NotFound(f"model {model_id!r} is not registered", param="model") from None
        if model.get("state") == "changed":
            raise ModelChanged(
                f"the file of model {model_id!r} changed since it was registered; register it again", param="model"
            )
        if model.get("state") == "missing":  # as a changed file: refused now, not a task that fails
            raise ModelChanged(
                f"the file of model {model_id!r} is missing from the models directory;"
                " put it back or register the model again",
                param="model",
            )
        return model

    def wait_finished(self, task_id: str, client_id: str | None) -> dict[str, Any]:
        """Block (cooperatively) until the task is finished; its Task object."""
        store = self.deps.store
        while True:
            task = store.get_task(task_id, client_id)
            if task["status"] in FINISHED:
                return task
            if self.deps.runtime.streams_ending:
                then = "goes on after its restart: fetch it then"
                if task["on_restart"] == "fail":  # a chat completion's, a completion's, or so asked
                    then = "is not resumed after its restart (restart policy fail): send the request again"
                raise Unavailable(
                    f"the service is stopping; {task['response_id']} {then}", retry_after=STOPPING_RETRY_AFTER
                )
            self._wait_past(task)

    def _wait_past(self, task: dict[str, Any]) -> None:
        """Until the task's next event (or a while: woken by the runtime's watch, else polled)."""
        runtime = self.deps.runtime
        runtime.wait_for_commit(
            task["id"], task["last_sequence_number"], WATCHED_WAIT_SECONDS if runtime.watches_store else POLL_SECONDS
        )

    def cancel(self, any_id: str, client_id: str | None) -> dict[str, Any]:
        """B.7 cancel of a response's or a task's task; the Task object."""
        task = self.deps.store.cancel(any_id, client_id)
        self.deps.runtime.notify_cancel(task["id"])
        return task

    def abandon(self, task_id: str, client_id: str | None) -> None:
        """The client of a (non-background) stream went away: cancel its task."""
        try:
            self.cancel(task_id, client_id)
            log.info("stream client went away; task cancelled", extra={"task_id": task_id})
        except TaskFinished:
            pass

    def forget(self, response_id: str, client_id: str | None) -> None:
        """``store: false``: delete a finished response once it was delivered (with those
        delivered meanwhile, :mod:`.forgetting`); an idempotency key keeps the final
        object for a retry of a client that missed it."""
        error = self.forgetter.forget(response_id, client_id)
        if error is not None:
            log.info("response %s not deleted after delivery: %s", response_id, error.message)

    def stream(
        self,
        task_id: str,
        client_id: str | None,
        *,
        after: int = 0,
        cancel_on_abandon: bool = False,
        forget_response: str | None = None,
        caller_id: str | None = None,
        task_events: bool = False,
        framing: Framing = SSE_FRAMES,
    ) -> Iterator[bytes]:
        """``client_id``: whose task it must be (None: any, for an admin); ``caller_id``:
        who reads it, whose revocation ends the stream; ``task_events``: the task's whole
        log (a response stream leaves its ``task.*`` events out); ``framing``: how its
        events are written (the OpenAI endpoints' chunks, or LMSP's events)."""
        deps = self.deps
        on_abandon = (lambda: self.abandon(task_id, client_id)) if cancel_on_abandon else None
        store = deps.store
        authorized = (lambda: store.client_active(caller_id)) if caller_id is not None else None
        frames = event_stream(
            store,
            deps.runtime,
            task_id,
            after=after,
            client_id=client_id,
            heartbeat=deps.config.heartbeat_seconds,
            on_abandon=on_abandon,
            monotonic=deps.monotonic,
            authorized=authorized,
            task_events=task_events,
            framing=framing,
        )
        if forget_response is None:
            return frames
        return self._then_forget(frames, task_id, forget_response, client_id)

    def _then_forget(
        self, frames: Iterator[bytes], task_id: str, response_id: str, client_id: str | None
    ) -> Iterator[bytes]:
        try:
            yield from frames
        except GeneratorExit:  # the client left: its task was cancelled, forget it once it ends
            self.forget_when_finished(task_id, response_id, client_id)
            raise
        task = self.deps.store.get_task(task_id, client_id)
        if task["status"] in FINISHED:
            self.forget(response_id, client_id)

    def forget_when_finished(self, task_id: str, response_id: str, client_id: str | None) -> None:
        """``store: false`` with nobody left to deliver it to: delete the response once its
        task has ended (in a thread, or a greenlet under gevent)."""
        threading.Thread(
            target=self._forget_when_finished, args=(task_id, response_id, client_id), name="lmsp-forget", daemon=True
        ).start()

    def _forget_when_finished(self, task_id: str, response_id: str, client_id: str | None) -> None:
        """``store: false`` with nobody left to deliver it to: delete the response when its
        (cancelled) task has ended, waiting at most FORGET_WAIT_SECONDS. A greenlet under
        gevent, where threading is patched."""
        deadline = self.deps.monotonic() + FORGET_WAIT_SECONDS
        while self.deps.monotonic() < deadline:
            try:
                task = self.deps.store.get_task(task_id, client_id)
            except Unavailable:  # a busy store: ask again (a greenlet's sleep under gevent)
                time.sleep(POLL_SECONDS)
                continue
            except LMSPError as exc:  # deleted meanwhile: nothing to forget
                log.info("response %s not deleted after its client left: %s", response_id, exc.message)
                return
            if task["status"] in FINISHED:
                self.forget(response_id, client_id)
                return
            if self.deps.runtime.streams_ending:
                break  # the worker stops
            self._wait_past(task)
        log.info("response %s not deleted after its client left: its task did not end", response_id)


def _replayed(headers: dict[str, str] | None = None) -> dict[str, str]:
    out = {idempotency.REPLAYED: "true"}
    out.update(headers or {})
    return out


class ResponsesResource:
    """``POST /v1/responses`` and ``GET /v1/responses``."""

    scopes = {"POST": "responses:write", "GET": "responses:read"}

    def __init__(self, deps: Deps, service: ResponsesService) -> None:
        self.deps = deps
        self.service = service

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        deps = self.deps
        client_id = caller(req)["id"]
        body = deps.body(req)
        key = idempotency.key_of(req)
        idem = None
        if key is not None:
            idem = (key, idempotency.fingerprint(client_id, req.method, req.path, body))
        earlier = context.load(deps.store, client_id, body, idem, deps.config.n_ctx)
        parsed = parse_create(body, deps.config, deps.random_seed, earlier)
        result = earlier.replay or self.service.create(client_id, parsed, idem, limited=not is_admin(caller(req)))
        replay = result.get("replay")
        if replay is not None and result.get("task") is None:
            # the key's response was deleted since: its stored answer (the final
            # Response object, or 404), as JSON: there is no stream to replay
            set_json(resp, replay[1], replay[0], _replayed())
            return
        response = result["response"] if replay is None else replay[1]
        assert response is not None  # a new task's, or the replayed one's (its task is there)
        response_id = response["id"]
        task_id = response["task"]["id"]
        location = {"Location": f"/v1/responses/{response_id}"}
        # Reads, waits and streams below see the caller's own response.
        if replay is not None:
            if parsed.stream:
                start_sse(
                    resp, self.service.stream(task_id, client_id, caller_id=client_id), headers=_replayed(location)
                )
            else:
                set_json(resp, replay[1], replay[0], _replayed(location if replay[0] == 202 else None))
            return
        if parsed.stream:
            forget = None if parsed.store else response_id
            start_sse(
                resp,
                self.service.stream(
                    task_id,
                    client_id,
                    cancel_on_abandon=not parsed.background,
                    forget_response=forget,
                    caller_id=client_id,
                ),
                headers=location if parsed.background else None,
            )
            return
        if parsed.background:
            set_json(resp, response, 202, location)
            return
        self.service.wait_finished(task_id, client_id)
        final = deps.store.get_response(response_id, client_id)
        if not parsed.store:
            self.service.forget(response_id, client_id)
        set_json(resp, final, 200)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        status = query_str(req, "status", choices=RESPONSE_STATUSES)
        limit = query_int(req, "limit", default=20, minimum=1, maximum=100)
        after = query_str(req, "after")
        if after is not None:
            check_cursor(after, "resp")
        page = self.deps.store.list_responses(owner_filter(req), status=status, limit=limit, after=after)
        set_json(resp, page)


def check_cursor(value: str, prefix: str) -> None:
    if not value.startswith(prefix + "_") or len(value) > 100:
        raise InvalidRequest(f"'after' must be an id starting with {prefix}_", param="after")


def stream_start(req: falcon.Request, param: str) -> int:
    """Where a resumed stream starts: ``Last-Event-ID`` wins over the query."""
    last_event_id = header_int(req, "Last-Event-ID")
    if last_event_id is not None:
        return last_event_id
    start: int = query_int(req, param, default=0, minimum=0)
    return start


class ResponseResource:
    """``GET`` (JSON, or SSE with ``?stream=true``) and ``DELETE /v1/responses/{id}``."""

    scopes = {"GET": "responses:read", "DELETE": "responses:write"}

    def __init__(self, deps: Deps, service: ResponsesService) -> None:
        self.deps = deps
        self.service = service

    def on_get(self, req: falcon.Request, resp: falcon.Response, response_id: str) -> None:
        check_id(response_id, "resp", "response")
        owner = owner_filter(req)
        stream = query_bool(req, "stream")
        if not stream:
            set_json(resp, self.deps.store.get_response(response_id, owner))
            return
        after = stream_start(req, "starting_after")
        task_id = self.deps.store.task_id_for_response(response_id, owner)
        start_sse(resp, self.service.stream(task_id, owner, after=after, caller_id=caller(req)["id"]))

    def on_delete(self, req: falcon.Request, resp: falcon.Response, response_id: str) -> None:
        check_id(response_id, "resp", "response")
        out = self.deps.store.delete_response(response_id, owner_filter(req))
        set_json(resp, out)


class ResponseCancelResource:
    """``POST /v1/responses/{id}/cancel``: B.7; answers the Response object."""

    scopes = {"POST": "responses:write"}

    def __init__(self, deps: Deps, service: ResponsesService) -> None:
        self.deps = deps
        self.service = service

    def on_post(self, req: falcon.Request, resp: falcon.Response, response_id: str) -> None:
        check_id(response_id, "resp", "response")
        body = self.deps.no_body(req)
        owner = owner_filter(req)

        def act() -> idempotency.Answer:
            self.service.cancel(response_id, owner)
            return 200, self.deps.store.get_response(response_id, owner)

        idempotency.answer(self.deps.store, req, resp, caller(req)["id"], body, act)
