"""The life of a request as a task: created (or its ``Idempotency-Key`` replayed),
delivered as a stream, in the background or once finished, cancelled, waited
for, forgotten once delivered (``store: false``) and deleted.

Every endpoint that makes a task (Responses, Chat Completions, Completions)
goes through :meth:`TaskService.submit`; the resources only parse the request
and render what it gives back. Nothing here knows HTTP: a stream is written
by the caller's :class:`~lmsp.service.streams.Framing`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterator

from lmsp.contracts import CreatedTask, CreateRequest, EarlierTurns, RuntimeAPI
from lmsp.errors import LMSPError, ModelChanged, ModelNotGenerative, NotFound, TaskFinished, Unavailable
from lmsp.store.states import FINISHED

from . import turns
from .forgetting import Forgetter
from .streams import POLL_SECONDS, Framing, event_stream

if TYPE_CHECKING:
    from lmsp.store import Store

log = logging.getLogger("lmsp.service")

FORGET_WAIT_SECONDS = 600.0  # how long a store:false response whose client left waits for its task to end
WATCHED_WAIT_SECONDS = 5.0  # a wait the runtime ends when the task moves; the time-out is a fallback
STOPPING_RETRY_AFTER = 5  # Retry-After of a plain request whose task outlives the worker's stop

Frames = Callable[[dict[str, Any]], Framing]  # the created Response object -> its stream's framing


@dataclass(frozen=True)
class Delivery:
    """What answers a create request. ``frames``: the stream of its task's events;
    otherwise ``body`` with ``status``: the finished Response object (200), the created
    one of a background response (202), or the answer an ``Idempotency-Key`` recorded
    (``stored``: its response is gone since, so the body is that answer as recorded).
    ``replayed``: the key's earlier request answered again."""

    status: int
    body: dict[str, Any] | None = None
    frames: Iterator[bytes] | None = None
    replayed: bool = False
    stored: bool = False
    response_id: str | None = None


@dataclass(frozen=True)
class Caller:
    """Who asks: the client's id, and whether its unfinished tasks are capped
    (``max_unfinished_per_client``; an admin's are not)."""

    client_id: str
    limited: bool = True


class TaskService:
    """Creating, delivering, waiting for, cancelling and deleting tasks and their
    responses, over the store and the runtime's contract."""

    def __init__(
        self, config: Any, store: Store, runtime: RuntimeAPI, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.store = store
        self.runtime = runtime
        self.monotonic = monotonic
        self.forgetter = Forgetter(store)

    # -- creation ---------------------------------------------------------

    def earlier_turns(self, client_id: str, body: dict[str, Any], key: tuple[str, str] | None) -> EarlierTurns:
        """The turns a Responses request continues (:mod:`.turns`)."""
        return turns.load(self.store, client_id, body, key, self.config.n_ctx)

    def create(self, caller: Caller, parsed: CreateRequest, key: tuple[str, str] | None = None) -> CreatedTask:
        """The request's task, created through the runtime (or the key's replay)."""
        model = self.check_serving(parsed.model)
        if "generation" not in model.get("capabilities", ("generation",)):
            raise ModelNotGenerative(
                f"model {parsed.model!r} is an embedding model: it makes no text (use POST /v1/embeddings)",
                param="model",
            )
        return self.runtime.create_task(
            replace(parsed, client_id=caller.client_id, idempotency=key, max_unfinished=self.cap(caller))
        )

    def cap(self, caller: Caller) -> int | None:
        """The caller's cap on its unfinished tasks (``max_unfinished_per_client``); None: none."""
        return (self.config.max_unfinished_per_client or None) if caller.limited else None

    def embed(self, caller: Caller, model: str, inputs: list[str | list[int]]) -> dict[str, Any]:
        """The inputs' vectors, made by a task the call runs itself (the runtime's ``embed``)."""
        return self.runtime.embed(model, inputs, client_id=caller.client_id, max_unfinished=self.cap(caller))

    def check_serving(self, model_id: str) -> dict[str, Any]:
        """The model's object. Unavailable while the worker starts or stops; NotFound for a
        model that is not registered, ModelChanged for one whose file changed or is missing."""
        runtime = self.runtime
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

    def submit(
        self,
        caller: Caller,
        parsed: CreateRequest,
        key: tuple[str, str] | None,
        frames: Frames,
        replay: CreatedTask | None = None,
    ) -> Delivery:
        """Create the request's task (``replay``: the key's answer found already) and
        deliver it: a stream of its events (a non-background stream whose client leaves
        cancels its task), the created response of a background request, or the
        finished one; ``store: false`` deletes the response once it was delivered."""
        result = replay or self.create(caller, parsed, key)
        if result["replay"] is not None:
            return self._replayed(caller, parsed, result, frames)
        response = result["response"]
        assert response is not None  # a new task's
        response_id, task_id = response["id"], response["task"]["id"]
        if parsed.stream:
            stream = self.stream(
                task_id,
                caller.client_id,
                framing=frames(response),
                cancel_on_abandon=not parsed.background,
                forget_response=None if parsed.store else response_id,
                caller_id=caller.client_id,
            )
            return Delivery(200, frames=stream, response_id=response_id)
        if parsed.background:
            return Delivery(202, body=response, response_id=response_id)
        return Delivery(200, body=self.finished(task_id, response_id, caller.client_id, parsed.store))

    def _replayed(self, caller: Caller, parsed: CreateRequest, result: CreatedTask, frames: Frames) -> Delivery:
        assert result["replay"] is not None
        status, stored = result["replay"]
        if result["task"] is None:  # the key's response was deleted since: its stored answer
            return Delivery(status, body=stored, replayed=True, stored=True)
        response_id, task_id = stored["id"], stored["task"]["id"]
        if parsed.stream:
            stream = self.stream(task_id, caller.client_id, framing=frames(stored), caller_id=caller.client_id)
            return Delivery(200, frames=stream, replayed=True, response_id=response_id)
        return Delivery(status, body=stored, replayed=True, response_id=response_id)

    def finished(self, task_id: str, response_id: str, client_id: str, keep: bool = True) -> dict[str, Any]:
        """The Response object once its task has finished; without ``keep`` the response
        is deleted once read."""
        self.wait_finished(task_id, client_id)
        final = self.store.get_response(response_id, client_id)
        if not keep:
            self.forget(response_id, client_id)
        return final

    def submit_together(self, caller: Caller, every: list[CreateRequest]) -> list[dict[str, Any]]:
        """Create a task per request (``store: false`` each), wait for all of them, and
        return their final Response objects in order, each deleted once read. A creation
        refused midway cancels the tasks created before it."""
        made: list[dict[str, Any]] = []
        try:
            for parsed in every:
                response = self.create(caller, parsed)["response"]
                assert response is not None  # a new task (no idempotency key)
                made.append(response)
        except BaseException:
            for response in made:
                self.abandon(response["task"]["id"], caller.client_id)
                self.forget_when_finished(response["task"]["id"], response["id"], caller.client_id)
            raise
        return [self.finished(r["task"]["id"], r["id"], caller.client_id, keep=False) for r in made]

    # -- waiting and streams ----------------------------------------------

    def wait_finished(self, task_id: str, client_id: str | None) -> dict[str, Any]:
        """Block (cooperatively) until the task is finished; its Task object."""
        while True:
            task = self.store.get_task(task_id, client_id)
            if task["status"] in FINISHED:
                return task
            if self.runtime.streams_ending:
                then = "goes on after its restart: fetch it then"
                if task["on_restart"] == "fail":  # a chat completion's, a completion's, or so asked
                    then = "is not resumed after its restart (restart policy fail): send the request again"
                raise Unavailable(
                    f"the service is stopping; {task['response_id']} {then}", retry_after=STOPPING_RETRY_AFTER
                )
            self._wait_past(task)

    def _wait_past(self, task: dict[str, Any]) -> None:
        """Until the task's next event (or a while: woken by the runtime's watch, else polled)."""
        runtime = self.runtime
        runtime.wait_for_commit(
            task["id"], task["last_sequence_number"], WATCHED_WAIT_SECONDS if runtime.watches_store else POLL_SECONDS
        )

    def stream(
        self,
        task_id: str,
        client_id: str | None,
        *,
        framing: Framing,
        after: int = 0,
        cancel_on_abandon: bool = False,
        forget_response: str | None = None,
        caller_id: str | None = None,
        task_events: bool = False,
    ) -> Iterator[bytes]:
        """``client_id``: whose task it must be (None: any, for an admin); ``caller_id``:
        who reads it, whose revocation ends the stream; ``task_events``: the task's whole
        log (a response stream leaves its ``task.*`` events out); ``framing``: how its
        events are written (the OpenAI endpoints' chunks, or LMSP's events)."""
        on_abandon = (lambda: self.abandon(task_id, client_id)) if cancel_on_abandon else None
        store = self.store
        authorized = (lambda: store.client_active(caller_id)) if caller_id is not None else None
        frames = event_stream(
            store,
            self.runtime,
            task_id,
            after=after,
            client_id=client_id,
            heartbeat=self.config.heartbeat_seconds,
            on_abandon=on_abandon,
            monotonic=self.monotonic,
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
        task = self.store.get_task(task_id, client_id)
        if task["status"] in FINISHED:
            self.forget(response_id, client_id)

    # -- cancel and forget ------------------------------------------------

    def cancel(self, any_id: str, client_id: str | None) -> dict[str, Any]:
        """B.7 cancel of a response's or a task's task; the Task object."""
        task = self.store.cancel(any_id, client_id)
        self.runtime.notify_cancel(task["id"])
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

    def forget_when_finished(self, task_id: str, response_id: str, client_id: str | None) -> None:
        """``store: false`` with nobody left to deliver it to: delete the response once its
        task has ended (in a thread, or a greenlet under gevent)."""
        threading.Thread(
            target=self._forget_when_finished, args=(task_id, response_id, client_id), name="lmsp-forget", daemon=True
        ).start()

    def _forget_when_finished(self, task_id: str, response_id: str, client_id: str | None) -> None:
        """Delete the response when its (cancelled) task has ended, waiting at most
        FORGET_WAIT_SECONDS. A greenlet under gevent, where threading is patched."""
        deadline = self.monotonic() + FORGET_WAIT_SECONDS
        while self.monotonic() < deadline:
            try:
                task = self.store.get_task(task_id, client_id)
            except Unavailable:  # a busy store: ask again (a greenlet's sleep under gevent)
                time.sleep(POLL_SECONDS)
                continue
            except LMSPError as exc:  # deleted meanwhile: nothing to forget
                log.info("response %s not deleted after its client left: %s", response_id, exc.message)
                return
            if task["status"] in FINISHED:
                self.forget(response_id, client_id)
                return
            if self.runtime.streams_ending:
                break  # the worker stops
            self._wait_past(task)
        log.info("response %s not deleted after its client left: its task did not end", response_id)

    # -- reads and deletion -----------------------------------------------

    def response(self, response_id: str, owner: str | None) -> dict[str, Any]:
        return self.store.get_response(response_id, owner)

    def request(self, response_id: str, owner: str | None) -> dict[str, Any]:
        """The request a response's task keeps, as checked."""
        return self.store.get_request(response_id, owner)

    def responses(self, owner: str | None, **filters: Any) -> dict[str, Any]:
        """A page of responses (``Store.list_responses``' filters)."""
        return self.store.list_responses(owner, **filters)

    def input_items(self, response_id: str, owner: str | None, **page: Any) -> dict[str, Any]:
        return self.store.list_input_items(response_id, owner, **page)

    def task(self, task_id: str, owner: str | None) -> dict[str, Any]:
        return self.store.get_task(task_id, owner)

    def tasks(self, owner: str | None, **filters: Any) -> dict[str, Any]:
        return self.store.list_tasks(owner, **filters)

    def events(self, task_id: str, owner: str | None, *, after: int, limit: int) -> dict[str, Any]:
        """A page of a task's event log."""
        return self.store.events(task_id, after=after, limit=limit, client_id=owner)

    def response_task(self, response_id: str, owner: str | None) -> str:
        """The id of a response's task."""
        return self.store.task_id_for_response(response_id, owner)

    def update_metadata(self, response_id: str, metadata: dict[str, str], owner: str | None) -> None:
        self.store.update_metadata(response_id, metadata, owner)

    def delete_response(self, response_id: str, owner: str | None) -> dict[str, Any]:
        """Delete a finished response with its task and events; the deletion object."""
        return self.store.delete_response(response_id, owner)
