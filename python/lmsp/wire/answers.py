"""The objects LMSP answers with (B.2 to B.9): errors, the service, clients and
pairing, models, responses with their output items, tasks and their events.

They declare the answers' schemas in the OpenAPI document; the service renders
its answers from its rows (:mod:`lmsp.objects`). A field that an answer may
leave out is ``X | UnsetType = UNSET``; one that is always there but may be
null is ``X | None`` without a default.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from msgspec import UNSET, Meta, UnsetType

from lmsp.auth import Scope
from lmsp.contracts import ModelState, TaskState

from .structs import JSON, Answer, Time

ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
OnRestart = Literal["fail", "retry", "resume"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]
EventType = Literal[
    "response.created",
    "response.queued",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.reasoning.delta",
    "response.reasoning.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "response.cancelled",
    "task.loading",
    "task.running",
    "task.cancelling",
    "task.requeued",
    "task.resumed",
]
#: what a client token may do
Scopes = list[Scope]


ResponseId = Annotated[str, Meta(pattern="^resp_")]
Deleted = Literal[True]


class ErrorDetail(Answer):
    """What went wrong: a stable `code`, a message for people, and the request field at fault (`param`)."""

    code: str
    message: str
    param: str | None


class Error(Answer):
    """An error answer (B.9)."""

    error: ErrorDetail


class Service(Answer):
    """The service and what it can do."""

    service_id: str
    object: Literal["service"]
    name: str
    version: str
    protocol: Literal["LMSP/1.0"]
    capabilities: list[str]
    created_at: Time | None


class Status(Answer):
    """A probe's answer."""

    status: str


class Client(Answer):
    """A paired client (B.2)."""

    id: str
    object: Literal["client"]
    name: str
    scopes: Scopes
    created_at: Time
    revoked_at: Time | None
    priority: Annotated[int, Meta(ge=1, le=100, description="Turns at starting tasks against a client of 1.")]
    max_running: Annotated[int, Meta(ge=0, description="Tasks started at once; null: no limit.")] | None
    max_queued: Annotated[int, Meta(ge=0, description="Tasks waiting to start; one more is 429.")] | None
    tokens_per_hour: Annotated[int, Meta(ge=0, description="Tokens of finished tasks per clock hour.")] | None
    last_seen_at: Annotated[
        Time | None, Meta(description="When its token was last used (written at most once a minute).")
    ]
    last_task_at: Annotated[Time | None, Meta(description="When its newest task was made.")]
    tokens_24h: Annotated[int, Meta(ge=0, description="Tokens of its tasks finished in the last 24 clock hours.")]
    tokens_today: Annotated[int, Meta(ge=0, description="Tokens of its tasks finished today, since 00:00 UTC.")]


class ClientList(Answer):
    """The paired clients."""

    object: Literal["list"]
    data: list[Client]


class Pairing(Answer):
    """A one-time pairing code, to redeem at `POST /v1/pair`."""

    object: Literal["pairing"]
    code: str
    scopes: Scopes
    created_at: Time
    expires_at: Time
    name: str | None | UnsetType = UNSET
    id: str | UnsetType = UNSET


class ClientToken(Answer):
    """A redeemed pairing code: the new client and its bearer token, shown once."""

    object: Literal["client_token"]
    client_id: str
    client_name: str
    token: str
    scopes: Scopes


class LayerRun(Answer):
    """Consecutive layers of a loaded model in one place."""

    place: Annotated[str, Meta(description="`cpu` (this box), or the RPC server's HOST:PORT.")]
    first: Annotated[int, Meta(ge=0, description="The first layer's index; the output layer's is the layer count.")]
    count: Annotated[int, Meta(ge=1)]


class RpcServerState(Answer):
    """An RPC server the model is split over, as the answering worker sees it."""

    address: str
    state: Annotated[
        Literal["connected", "unreachable", "idle"],
        Meta(
            description="connected: an engine of this worker holds layers there; unreachable: the last "
            "load found it silent or speaking another protocol version (see error); idle: not in use."
        ),
    ]
    layers: Annotated[int, Meta(ge=0, description="The model's layers held there (the output layer counts).")]
    error: str | None


class Model(Answer):
    """A registered GGUF model."""

    id: str
    object: Literal["model"]
    created: Time
    owned_by: Literal["local"]
    digest: Annotated[str, Meta(pattern="^sha256:[0-9a-f]{64}$")]
    size_bytes: int
    format: Literal["gguf"]
    architecture: str | None
    parameters: int | None
    quantization: str | None
    context_length: int | None
    state: ModelState
    file: Annotated[
        str,
        Meta(
            description="The model file: its path relative to the models directory, or its name for a "
            "file the operator registered from elsewhere."
        ),
    ]
    memory_bytes: Annotated[
        Annotated[int, Meta(ge=0)] | None,
        Meta(
            description="The memory the model holds in the worker that answers, while loaded there (null "
            "otherwise): its weights (the file's bytes) and its KV cache (layers x context x parallel "
            "sequences x KV heads x head size, K and V at 2 bytes each; none for an embedding model). "
            "Compute buffers are not counted.",
        ),
    ]
    kv_files: Annotated[
        int,
        Meta(
            ge=0,
            description="The KV-cache files kept on disk for the model's file (the prefix cache's "
            "snapshots of conversations and chains of responses), as of a scan at most a few seconds old.",
        ),
    ]
    kv_bytes: Annotated[int, Meta(ge=0, description="The total size of those KV files, in bytes.")]
    layers: Annotated[
        list[LayerRun] | None,
        Meta(description="Where the model's layers are in the answering worker while loaded there (null otherwise)."),
    ]
    rpc_servers: Annotated[
        list[RpcServerState],
        Meta(description="The RPC servers (rpc_servers) the model's layers are split over; empty without."),
    ]
    has_chat_template: Annotated[
        bool,
        Meta(
            description="The file declares a chat template (tokenizer.chat_template): prompts are rendered "
            "with it; without one they take the plain format of docs/API.md."
        ),
    ]
    capabilities: Annotated[
        list[Literal["generation", "embeddings"]],
        Meta(
            description="What the model does: an embedding model (an encoder) has `embeddings` only, and "
            "the generation endpoints refuse it (model_not_generative)."
        ),
    ]


class ModelList(Answer):
    """The registered models."""

    object: Literal["list"]
    data: list[Model]


class DeletedModel(Answer):
    """A model unregistered."""

    id: str
    object: Literal["model"]
    deleted: Deleted


class TopLogprob(Answer):
    """A token and its log probability."""

    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    """A token of the output, its log probability and the most likely tokens in its place."""

    top_logprobs: list[TopLogprob]


class OutputText(Answer):
    """Text of an output message."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[TokenLogprob] | UnsetType = UNSET


class OutputMessage(Answer, tag_field="type", tag="message"):
    """The assistant's message of an output."""

    id: str
    role: Literal["assistant"]
    status: ItemStatus
    content: list[OutputText]


class FunctionCall(Answer, tag_field="type", tag="function_call"):
    """A call of a function tool the model made; its `arguments` are JSON text."""

    id: Annotated[str, Meta(pattern="^fc_")]
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


class ReasoningText(Answer):
    """The model's reasoning, as text."""

    type: Literal["reasoning_text"]
    text: str


class Reasoning(Answer, tag_field="type", tag="reasoning"):
    """What a thinking model reasoned before its answer."""

    id: Annotated[str, Meta(pattern="^rs_")]
    summary: Annotated[list[Any], Meta(max_length=0)]
    content: list[ReasoningText] | UnsetType = UNSET


#: an item of a response's output
OutputItem = OutputMessage | FunctionCall | Reasoning


class TaskError(Answer):
    """Why a task failed."""

    code: str
    message: str


class InputTokensDetails(Answer):
    """The prompt's tokens read from the cache, and those written to it."""

    cached_tokens: int
    cache_write_tokens: int


class OutputTokensDetails(Answer):
    """The output's tokens of reasoning."""

    reasoning_tokens: int


class ResponseUsage(Answer):
    """The tokens a response took."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(Answer):
    """Why a response is incomplete."""

    reason: str


#: a queued task's place: 1 for the next to start (any model)
QueuePosition = Annotated[int, Meta(ge=1, description="While queued: 1 for the next task to start.")]
#: the queued tasks of its model that start before it
QueuedAhead = Annotated[int, Meta(ge=0, description="While queued: tasks of its model that start before it.")]
#: the output tokens a running task generated so far
OutputTokensSoFar = Annotated[
    int, Meta(ge=0, description="While running or cancelling: output tokens generated so far in this attempt.")
]


class ResponseTask(Answer):
    """The task of a response (B.4): its place in the queue while it waits to start, its
    output tokens so far while it runs."""

    id: str
    status: TaskState
    on_restart: OnRestart
    queue_position: QueuePosition | UnsetType = UNSET
    queued_ahead: QueuedAhead | UnsetType = UNSET
    output_tokens: OutputTokensSoFar | UnsetType = UNSET


class ResponseTextFormat(Answer):
    """The kind of the output's text."""

    type: Literal["text", "json_object", "json_schema"]


class ResponseText(Answer):
    """How the output's text is shaped."""

    format: ResponseTextFormat
    verbosity: str | None


class ResponseReasoning(Answer):
    """The reasoning the request asked for."""

    effort: str | None
    summary: str | None


class ResponseConversation(Answer):
    """The conversation a response is part of."""

    id: Annotated[str, Meta(pattern="^conv_")]


class Response(Answer):
    """A response (B.6): its status, its output, and the request's settings it ran with."""

    id: ResponseId
    object: Literal["response"]
    created_at: Time
    status: ResponseStatus
    background: bool
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None
    error: TaskError | None
    incomplete_details: IncompleteDetails | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    metadata: dict[str, str]
    task: ResponseTask
    completed_at: int | None
    previous_response_id: ResponseId | None
    instructions: str | None
    tools: list[Any]
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any]
    truncation: Literal["auto", "disabled"]
    parallel_tool_calls: bool
    text: ResponseText
    presence_penalty: float
    frequency_penalty: float
    top_logprobs: int
    reasoning: ResponseReasoning | None
    max_tool_calls: int | None
    store: bool
    service_tier: str
    safety_identifier: str | None
    prompt_cache_key: str | None
    user: str | None
    conversation: ResponseConversation | None


class Page(Answer):
    """A page of a list (not a schema of its own: each list's is)."""

    object: Literal["list"]
    has_more: bool
    first_id: str | None
    last_id: str | None


class ResponseList(Page):
    """A page of the caller's responses."""

    data: list[Response]


class DeletedResponse(Answer):
    """A response deleted with its task and events."""

    id: str
    object: Literal["response"]
    deleted: Deleted


class Task(Answer):
    """A task (B.4): the work of a response, and where its event log is."""

    id: Annotated[str, Meta(pattern="^task_")]
    object: Literal["task"]
    response_id: str
    client_id: Annotated[str | None, Meta(description="The client whose request made it.")]
    model: str
    status: TaskState
    on_restart: OnRestart
    attempts: int
    created_at: Time
    started_at: Time | None
    finished_at: Time | None
    error: TaskError | None
    last_sequence_number: int
    queue_position: QueuePosition | UnsetType = UNSET
    queued_ahead: QueuedAhead | UnsetType = UNSET
    output_tokens: OutputTokensSoFar | UnsetType = UNSET


class TaskList(Page):
    """A page of the caller's tasks."""

    data: list[Task]


class Event(Answer):
    """An event of a task's log (B.5); its other fields are those of its `type`."""

    type: EventType
    sequence_number: Annotated[int, Meta(ge=1)]
    created_at: Time
    response: Response | UnsetType = UNSET
    task: Task | UnsetType = UNSET
    delta: str | UnsetType = UNSET
    item_id: str | UnsetType = UNSET
    output_index: int | UnsetType = UNSET
    content_index: int | UnsetType = UNSET
    text: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET
    item: OutputItem | UnsetType = UNSET
    part: OutputText | UnsetType = UNSET
    logprobs: list[TokenLogprob] | UnsetType = UNSET

    # a response.failed carries its error in response.error (B.6); a top-level
    # "error" is what the openai package takes for a failed stream
    __schema__: ClassVar[JSON] = {"not": {"required": ["error"]}}


class EventList(Answer):
    """A page of a task's event log."""

    object: Literal["list"]
    data: list[Event]
    has_more: bool


#: the answers of LMSP's own endpoints, as the OpenAPI document names them
ANSWERS = (
    Error,
    Service,
    Status,
    Client,
    ClientList,
    Pairing,
    ClientToken,
    Model,
    ModelList,
    DeletedModel,
    Response,
    ResponseList,
    DeletedResponse,
    Task,
    TaskList,
    Event,
    EventList,
)
