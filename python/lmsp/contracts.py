"""Named types that one layer hands another.

Each type here is part of a contract between two layers, so that both sides
name the same fields. The module imports nothing from the api, the runtime or
the native extension, and any layer may import it.

The store's side (:mod:`lmsp.store`):

* :class:`StepItem`: one task's part of an engine step, as the runtime hands
  it to ``Store.append_step``;
* :class:`StepState`: where ``append_step`` continues a task from;
* :data:`EventRow` (fields :data:`EVENT_ROW_FIELDS`): an event as the store
  writes and reads it;
* :class:`StepOutcome`: what ``append_step`` returns;
* :class:`ClaimRecord` (with :class:`Resume`): what a worker gets for each task
  it claims;
* :class:`CreatedTask`: what ``Store.create_task`` returns (and the runtime's
  ``create_task`` hands on to the API).

The runtime's side, as the API sees it:

* :class:`RuntimeAPI`: what the web layer asks of the runtime (the runtime,
  and the API tests' scripted one, implement it);
* :class:`NewTask`: a request's task, for the runtime to create.

The states every layer names: :data:`TaskState` (:data:`TASK_STATES`) and
:data:`ModelState` (:data:`MODEL_STATES`).

The engine's side (:mod:`lmsp.native`):

* :class:`EngineResult` (with :class:`EngineTimings`): one result of
  ``Engine.poll()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, NotRequired, Protocol, Required, TypedDict, get_args

#: the states of a task (B.4)
TaskState = Literal["queued", "loading", "running", "cancelling", "completed", "failed", "cancelled"]
TASK_STATES: tuple[str, ...] = get_args(TaskState)
#: a client's priority: its turns at starting tasks against a client of 1 (lmsp.store.sharing)
MAX_PRIORITY = 100
#: the states of a registered model, as the registry reports them
ModelState = Literal["available", "loading", "loaded", "failed", "missing", "changed", "unavailable"]
MODEL_STATES: tuple[str, ...] = get_args(ModelState)


class StepItem(TypedDict, total=False):
    """One task's output in one engine step; only ``task_id`` is required.

    ``delta``: the text it adds; ``tokens``: the token ids of the step (a token
    without text is held back until text follows); ``finish``: None, or how the
    task ends (``stop``, ``length``, ``cancelled``, ``error``), with ``error``
    (``{"code", "message"}``) and ``usage`` for the final Response;
    ``kv_path``: the task's latest KV snapshot; ``attempt``: the task's
    ``attempts`` in the claim that made the output (an item of an earlier
    claim is skipped); ``logprobs``: for a task that asked for them, the
    entries (OpenAI's ``token``, ``logprob``, ``bytes``, ``top_logprobs``) of
    the tokens whose text is ``delta``; ``held_tokens``: on the chat layer, tokens
    after the text its rows took (their text not shown yet), held back like a token
    without text, so that a resume samples them again with their log probabilities.

    An output of function calls (:mod:`lmsp.calls`) has ``calls`` instead of
    ``delta``: the step's segments, in order, each ``{"index", "args"}`` (call
    ``index``'s arguments in the step) with ``call`` (``{"name", "head"}``)
    where the call opens, ``done`` (``{"tail", "name", "arguments"}``) where
    it ends before the next one, and ``tail`` (its closing text) in the step
    that ends the output.
    """

    task_id: Required[str]
    # an output on the model's own chat layer (lmsp.items.chat) has these instead of
    # delta: its events as (type, raw text or None, payload), and the task's item_open
    # from then on (lmsp.objects.CHAT_OPEN, or CHAT_THINK for a model that thinks)
    rows: list[tuple[str, str | None, dict[str, Any]]]
    mark: int
    held_tokens: list[int]
    delta: str
    tokens: list[int]
    finish: str | None
    error: dict[str, Any] | None
    usage: dict[str, Any] | None
    kv_path: str | None
    attempt: int
    calls: list[dict[str, Any]]
    logprobs: list[dict[str, Any]]


class StepState(NamedTuple):
    """A running task as its last committed step left it, which is what the next
    step continues from."""

    owner: str
    last_seq: int  # the number of its last event
    item_open: int  # 1 while its output item is open (added, not yet done)
    pending_tokens: str  # token ids held back until text follows, comma separated
    kv_path: str | None
    item_id: str  # the id of its output item


#: the fields of an :data:`EventRow`, in order
EVENT_ROW_FIELDS = ("seq", "type", "created_at", "text", "data")
#: ``(seq, type, created_at, text, data)``: ``text`` for a delta, ``data`` (JSON) for every other event
EventRow = tuple[int, str, float, str | None, str | None]


class StepOutcome(TypedDict):
    """What ``append_step`` did: the tasks it skipped (not this owner's, not
    running, or output of an earlier claim), those that ended cancelled, and
    the final state of each task that ended. ``events`` only when asked for:
    per task still running, ``(item_id, rows)``, every event the step wrote
    for it, in order."""

    skipped: list[str]
    cancelled: list[str]
    finished: dict[str, str]
    events: NotRequired[dict[str, tuple[str, list[EventRow]]]]


class Resume(TypedDict):
    """Where a resumed task's output stands: the tokens generated, the text
    emitted, and its KV snapshot (None if it has none); ``logprobs``: the
    entries its text deltas carry, where they carry some."""

    generated: list[int]
    emitted: str
    kv_path: str | None
    logprobs: NotRequired[list[dict[str, Any]]]


class ClaimRecord(TypedDict):
    """What a worker needs to run a task it claimed; ``status`` is the state it
    was claimed in, ``resume`` is set for a task that continues (``running``)."""

    task_id: str
    response_id: str
    model: str
    request: dict[str, Any]
    status: str
    on_restart: str
    attempts: int
    item_id: str
    resume: Resume | None
    client_id: str | None


class CreatedTask(TypedDict):
    """A task created, or an idempotent request replayed. ``response``: the
    Response as created (``queued``); ``task``: its Task object. ``replay`` is
    None for a new task, else ``(status_code, body)`` to send again (nothing was
    created; ``task`` is None when the key's task was deleted since). ``claim``:
    the claim record when the new task was claimed for a worker in the same
    transaction (absent from a replay)."""

    response: dict[str, Any] | None
    task: dict[str, Any] | None
    replay: tuple[int, dict[str, Any]] | None
    claim: NotRequired[ClaimRecord | None]


@dataclass(frozen=True)
class NewTask:
    """A request's task as the API hands it to the runtime: the checked ``request``
    (what the task keeps), the prompt's ``messages`` (instructions first), whose
    client it is, and what the store needs to create it. ``idempotency``:
    ``(key, fingerprint)``; ``max_unfinished``: the client's cap on unfinished
    tasks (None: none); ``kind``: ``response``, ``chat.completion`` or
    ``text_completion``, which names the response's id; ``items``: the input
    items to keep with the response; ``conversation``: ``(id, version)`` of the
    conversation it continues (its items, read at that version, are in ``messages``)."""

    client_id: str | None
    model: str
    messages: list[dict[str, str]]
    request: dict[str, Any]
    on_restart: str
    background: bool
    stream: bool
    idempotency: tuple[str, str] | None = None
    max_unfinished: int | None = None
    kind: str = "response"
    items: list[dict[str, Any]] | None = None
    conversation: tuple[str, int] | None = None

    def creation(self) -> dict[str, Any]:
        """The arguments of ``Store.create_task`` for this task (all but ``claim``)."""
        return {
            "items": self.items,
            "conversation": self.conversation,
            "client_id": self.client_id,
            "model": self.model,
            "request": self.request,
            "on_restart": self.on_restart,
            "background": self.background,
            "stream": self.stream,
            "idempotency": self.idempotency,
            "max_unfinished": self.max_unfinished,
            "kind": self.kind,
        }


@dataclass(frozen=True)
class CreateRequest(NewTask):
    """A create request as the API checked it: the task to create (its client and its
    creation's options are the caller's, set by the task service), and ``store``."""

    store: bool = True


TURN_KEY = "chain_turn"  # lmsp.store.chains.TURN_KEY: the previous turn, for the store


@dataclass(frozen=True)
class EarlierTurns:
    """What a new response continues: the messages of the earlier turns, the calls made
    in them, and where they come from. ``replay``: the stored answer of an idempotent
    request made again whose context is gone since (nothing is created)."""

    messages: list[dict[str, str]] = field(default_factory=list)
    calls: dict[str, str] = field(default_factory=dict)
    previous_response_id: str | None = None
    conversation: tuple[str, int] | None = None
    replay: CreatedTask | None = None
    turn: dict[str, Any] | None = None

    def fields(self, calls: dict[str, str]) -> dict[str, Any]:
        """What the request keeps of it (``context`` by reference when ``turn`` names the
        previous response's turn); ``calls``: those of the new input too."""
        out: dict[str, Any] = {}
        if self.previous_response_id is not None:
            out["previous_response_id"] = self.previous_response_id
        if self.conversation is not None:
            out["conversation"] = {"id": self.conversation[0]}
        if self.messages:
            out["context"] = list(self.messages)
        if self.turn is not None:
            out[TURN_KEY] = self.turn
        own = {k: v for k, v in calls.items() if k not in self.calls} if self.turn is not None else calls
        if own:
            out["calls"] = dict(own)
        return out


NO_TURNS = EarlierTurns()


class RuntimeAPI(Protocol):
    """The runtime as the web layer drives it: ``lmsp.runtime.Runtime`` in the
    service. Its states: ``ready`` (started, start-up recovery done, not
    stopped), ``draining`` (a stop is coming: no new tasks), ``streams_ending``
    (the worker stops now: every stream and wait ends), ``watches_store`` (a
    waiter is woken when its task moves, whoever runs it; otherwise waits are
    short polls)."""

    @property
    def ready(self) -> bool: ...

    @property
    def draining(self) -> bool: ...

    @property
    def streams_ending(self) -> bool: ...

    @property
    def watches_store(self) -> bool: ...

    def create_task(self, new: NewTask) -> CreatedTask:
        """Create the task (the prompt checked first when the model is loaded) and
        have it run: started here when a slot is free, else queued."""
        ...

    def notify_cancel(self, task_id: str) -> None:
        """A cancel the store accepted: stop the task's sequence if it runs here."""
        ...

    def wait_for_commit(self, task_id: str, after_seq: int, timeout: float, since: int | None = None) -> None:
        """Return once the task has events after ``after_seq``, or after ``timeout``;
        ``since``: :meth:`commit_generation` as read before the caller's last read."""
        ...

    def commit_generation(self) -> int:
        """A number that changes with every commit this process announces."""
        ...

    def committed_events(self, task_id: str, after: int) -> list[dict[str, Any]] | None:
        """The task's events after ``after`` from this process's latest commit, when
        it wrote all of them; None: read them from the store."""
        ...

    def model_object(self, model_id: str) -> dict[str, Any]: ...

    def detokenize(self, model_id: str, tokens: list[int]) -> str:
        """The text of token ids in the model's vocabulary (the model loaded first when it
        is not); InvalidRequest for an id outside it."""
        ...

    def prompt_pieces(self, model_id: str, prompt: str | list[int]) -> list[bytes]:
        """The bytes of each token of a completion's prompt as its task tokenizes it
        (the model loaded first when it is not); InvalidRequest for an id outside the
        vocabulary."""
        ...

    def embed(
        self,
        model_id: str,
        inputs: list[str | list[int]],
        *,
        client_id: str | None = None,
        max_unfinished: int | None = None,
    ) -> dict[str, Any]:
        """``{"vectors", "prompt_tokens", "task_id"}``: the inputs' normalized embeddings,
        in order, computed as a task of the store (of ``client_id``, under its cap on
        unfinished tasks)."""
        ...

    def list_models(self) -> list[dict[str, Any]]: ...

    def register_model(
        self,
        path: str,
        model_id: str | None = None,
        *,
        rpc_servers: list[str] | None = None,
        tensor_split: list[float] | None = None,
    ) -> dict[str, Any]: ...

    def load_model(self, model_id: str) -> dict[str, Any]: ...

    def unload_model(self, model_id: str) -> dict[str, Any]: ...

    def delete_model(self, model_id: str) -> None: ...

    def metrics(self) -> dict[str, Any]:
        """The worker's figures for ``/metrics``."""
        ...


class EngineTimings(TypedDict, total=False):
    """How long a sequence took, in milliseconds, and its decode rate; on its last
    result only (the others have an empty dict)."""

    queued_ms: float
    prompt_ms: float
    first_token_ms: float
    decode_ms: float
    total_ms: float
    tokens_per_s: float


class EngineResult(TypedDict):
    """One result of ``Engine.poll()``: a sequence's next tokens and their text, in
    order per sequence. ``finish`` is None until the sequence's last result, then
    ``stop``, ``length``, ``cancelled`` or ``error`` (with ``error``, the message).
    ``n_cached``: the leading prompt tokens taken from the prefix cache (a free
    slot's KV or a KV file's); ``n_loaded``: those a KV file gave;
    ``prefix_refused``: the KV file handed with the prompt did not load.
    ``logprobs``: one per token, for a sequence submitted with ``logprobs=True``;
    ``top_logprobs``: per token, the ``(token, logprob)`` pairs of its position's
    most likely tokens, for one submitted with ``top_logprobs`` too.
    ``code``: the error code of an ``error`` end where it is known: set by the
    engine on a grammar that allows no next token (``grammar_dead_end``), and by
    the runtime on an end it makes itself (an engine closed under its sequence)."""

    seq: int
    tokens: list[int]
    text: str
    finish: str | None
    error: str | None
    n_prompt: int
    n_generated: int
    n_cached: int
    timings: EngineTimings
    n_loaded: NotRequired[int]
    prefix_refused: NotRequired[bool]
    logprobs: NotRequired[list[float]]
    top_logprobs: NotRequired[list[list[tuple[int, float]]]]
    code: NotRequired[str]
