"""A request's task into this worker: checked, created, and started early when it can.

:meth:`Admission.create_task` is the one operation the web layer asks for. The
prompt is rendered and checked against the model's context when the model is
loaded here. A request that finds a free engine slot of its own worker, with its
model loaded there, skips the queue: :meth:`~Admission.reserve` holds the slot,
:meth:`~Admission.start_early` submits the prompt before the task's creation
commits (so the prefill runs meanwhile; its results are held until the task is
adopted), the store's ``create_task(claim=...)`` creates the task already claimed
and ``running`` in the same transaction, and :meth:`~Admission.adopt` hands it to
the scheduler (or gives the slot back, the early sequence cancelled, when the
task was not created here). Any other task is queued, and the scheduler is woken
to claim it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..contracts import ClaimRecord, CreatedTask, NewTask
from ..errors import ContextLengthExceeded, InvalidRequest
from lmsp.serving.hubsafe import offload
from lmsp.runtime import chat_layer, constraints
from lmsp.runtime import kv
from . import prompt as prompting
from .state import Run, WorkerState
from lmsp.runtime.calls import CallShaper

log = logging.getLogger("lmsp.runtime")


def keep_seen(new: NewTask, dropped: int) -> NewTask:
    """The task with the context it keeps by value (a conversation's items) cut to the
    turns its prompt holds once truncated (``dropped``: how many went): a response
    stores no more of a long conversation than the model could see, and its prompt,
    rendered again on a resume or a retry, is the same. A context kept by reference
    (a chain's) is the store's."""
    if not dropped or "chain_turn" in new.request:
        return new
    seen = prompting.seen_context(new.request, dropped)
    return new if seen is None else dataclasses.replace(new, request={**new.request, "context": seen})


class Admission:
    """The creation of tasks for this worker (see the module docstring)."""

    def __init__(self, state: WorkerState) -> None:
        self.state = state

    def create_task(self, new: NewTask) -> CreatedTask:
        """Check the request, create its task (claimed here when a slot is free), and
        start it or have it claimed; what ``Store.create_task`` returns."""
        state = self.state
        constraints.check(new.request)  # first: the chat layer's rendering converts the schemas too
        on_chat_layer = self.check_chat_layer(new)
        tokens, dropped = None, 0  # a chat-layer task's prompt is rendered when it starts
        if not on_chat_layer:
            tokens, dropped = self.prompt_of(new.model, prompting.with_tools(new.messages, new.request), new.request)
        new = keep_seen(new, dropped)
        slot = self.reserve(new.model)
        early = None
        try:
            if slot is not None:
                # the prefill runs while the task commits; nothing of it is out before
                early = self.start_early(new.model, tokens, new.request, new.client_id, kind=new.kind)
            # a write, off the gevent hub: a lock wait stops only this request
            created: CreatedTask = offload(state.store.create_task, **new.creation(), claim=slot)
        except BaseException:
            if slot is not None:
                self.adopt(None, early=early)
            raise
        if slot is not None:
            self.adopt(created.get("claim"), tokens, early=early)
        if created["replay"] is None and created.get("claim") is None:
            state.wake_scheduler()
        return created

    def check_chat_layer(self, new: NewTask) -> bool:
        """A request on the chat layer of a model loaded here (:mod:`.chat_layer`): its
        prompt rendered as the run will, truncated as it asks (InvalidRequest where the
        template refuses it, ContextLengthExceeded where it does not fit). A model not
        loaded here yet is checked when the task starts. Whether the request is on the
        chat layer (checked here)."""
        engine = self.state.registry.engine(new.model)
        try:
            if engine is None or not chat_layer.applies(engine, new.request):
                return False
            max_tokens = prompting.sampling(new.request, self.state.config)["max_tokens"]
            tokens = chat_layer.truncated_tokens(engine, new.request, max_tokens)
        except ValueError as exc:
            raise InvalidRequest(f"the request cannot be rendered: {exc}", param="input") from None
        except Exception as exc:  # a closed engine (unloaded meanwhile): checked at run time
            log.debug("check_chat_layer: %s", exc)
            return False
        if len(tokens) >= engine.n_ctx:
            raise ContextLengthExceeded(
                f"the prompt is {len(tokens)} tokens; model {new.model} takes at most {engine.n_ctx - 1} "
                "with room for one output token",
                param="input",
            )
        return True

    def prompt_of(
        self, model_id: str, prompt_messages: list[dict[str, str]], request: dict[str, Any] | None = None
    ) -> tuple[list[int] | None, int]:
        """The prompt's tokens when the model is loaded here (None: checked at run time),
        truncated as ``request`` asks, and how many turns truncation dropped;
        ContextLengthExceeded when it cannot fit with one output token. A completion's
        raw ``prompt`` is the prompt (no chat template)."""
        engine = self.state.registry.engine(model_id)
        if engine is None:
            return None, 0
        dropped = 0
        raw = request is not None and request.get("prompt") is not None
        param = "prompt" if raw else "input"
        try:
            max_tokens = prompting.sampling(request or {}, self.state.config)["max_tokens"]
            if raw:
                assert request is not None
                tokens = prompting.prompt_tokens(engine, request, max_tokens)
            else:
                tokens, dropped = prompting.truncated(engine, prompt_messages, request or {}, max_tokens)
        except ValueError as exc:  # what the chat template or the tokenizer refuses: so would the run
            where = "suffix" if raw and "suffix" in str(exc) else param
            raise InvalidRequest(f"the request cannot be rendered: {exc}", param=where) from None
        except Exception as exc:  # a closed engine (unloaded meanwhile): check at run time
            log.debug("prompt_of: %s", exc)
            return None, 0
        n = len(tokens)
        if n >= engine.n_ctx:
            raise ContextLengthExceeded(
                f"the prompt is {n} tokens; model {model_id} takes at most {engine.n_ctx - 1} "
                "with room for one output token",
                param=param,
            )
        return tokens, dropped

    def reserve(self, model_id: str) -> tuple[str, float] | None:
        """A free engine slot of this worker for a task about to be created, as the
        ``claim=(owner, lease)`` of ``store.create_task``; None when there is none
        (or the model is not loaded here): the task is then queued as usual.
        Every reservation ends with one :meth:`adopt` call."""
        state = self.state
        if not state.ready or state.stopping or state.draining or state.registry.engine(model_id) is None:
            return None
        with state.lock:
            if state.slots_free() <= 0:
                return None
            state.reserved += 1
        return state.owner, state.lease

    def start_early(
        self,
        model_id: str,
        tokens: list[int] | None,
        request: dict[str, Any],
        client_id: str | None = None,
        *,
        kind: str = "response",
    ) -> Run | None:
        """Start the sequence of a task being created in a reserved slot, before its
        creation commits, so that the prefill runs meanwhile; pass the result to
        :meth:`adopt`. Nothing of it reaches the store or a client before the task
        is adopted: its results are held until then, and dropped with the sequence
        if the task is not created here. None when it cannot start early (the
        scheduler then starts the task as usual, as it does any task whose output
        is held to a grammar). ``client_id``: the task's client,
        the scope of the engine's prefix cache; ``kind``: the task's (``response``,
        ``chat.completion``, ``text_completion``), which decides its KV file."""
        state = self.state
        engine = state.registry.engine(model_id)
        if engine is None or not tokens or state.stopping or chat_layer.applies(engine, request):
            return None  # a chat-layer task's output needs its item id: started as usual
        if constraints.constrained(request):
            return None  # the grammar's setup runs in the scheduler's thread, not on the hub
        try:
            kwargs = prompting.sampling(request, state.config)
        except (ValueError, TypeError):
            return None
        run = Run("", model_id, state="running", held=[], calls=CallShaper.for_request(request))
        try:
            # a KV file of the prompt's start: read off the hub
            keep = kv.continuable(request, kind=kind)
            ticket = offload(state.kvdisk.prepare, engine, model_id, tokens, client_id or "", keep=keep)
            with state.lock:
                if state.registry.engine(model_id) is not engine:
                    return None  # unloaded meanwhile: the scheduler loads it
                run.engine, run.seq = (
                    engine,
                    engine.submit(tokens, cache_key=client_id or "", **kwargs, **state.kvdisk.submit_kwargs(ticket)),
                )
                state.by_seq[run.key()] = run
                state.kvdisk.submitted(engine, run.seq, ticket)
                state.early.append(run)
        except Exception as exc:  # the usual start reports it on the task
            log.debug("early start refused: %s", exc)
            return None
        return run

    def adopt(self, claim: ClaimRecord | None, tokens: list[int] | None = None, early: Run | None = None) -> None:
        """End a reservation: start the task ``create_task`` claimed for this worker
        (its claim record), or give the slot back (None: not claimed, or failed).
        ``tokens``: the prompt as :meth:`prompt_of` rendered it; ``early``: what
        :meth:`start_early` returned, whose sequence becomes the task's."""
        state = self.state
        dropped = None
        with state.lock:
            state.reserved -= 1
            if early is not None:
                state.early.remove(early)
            if claim is None:
                state.claim_due = True  # the slot is free again
                dropped = early
            elif state.stopping:
                dropped = early
            elif early is not None:
                early.task_id, early.attempt = claim["task_id"], claim.get("attempts", 0)
                state.runs[early.task_id] = early
                state.released.append(early)
            else:
                run = Run(
                    claim["task_id"], claim["model"], attempt=claim.get("attempts", 0), state="running", tokens=tokens
                )
                state.runs[run.task_id] = run
                state.adopted.append((run, claim))
            if dropped is not None:
                state.by_seq.pop(dropped.key(), None)
        if dropped is not None:
            dropped.cancel_sequence()
        if early is not None and dropped is None:
            state.commit_wake.set()  # its held results, a first token among them maybe
            return
        # a claim left when stopping keeps its lease, which runs out: recovery applies its policy
        state.sched_wake.set()
