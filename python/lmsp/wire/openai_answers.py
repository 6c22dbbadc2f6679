"""The objects OpenAI's endpoints answer with (B.11): chat completions (stored,
listed, streamed as chunks), text completions and embeddings.

They declare the answers' schemas in the OpenAPI document; the service renders
its answers itself (:mod:`lmsp.api.openai_shapes`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, UnsetType

from .answers import Deleted, Page, TaskError, TokenLogprob
from .structs import Answer, Name, Time

Finish = Literal["stop", "length"]
ChatFinish = Literal["stop", "length", "tool_calls"]
CallId = Annotated[str, Meta(min_length=1, max_length=64)]


class PromptTokensDetails(Answer):
    """The prompt's tokens read from the cache."""

    cached_tokens: int


class CompletionTokensDetails(Answer):
    """The completion's tokens of reasoning."""

    reasoning_tokens: int


class CompletionUsage(Answer):
    """The tokens a completion took."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails


class ChatCompletionMessageToolCallFunction(Answer, forbid_unknown_fields=True):
    """The function a tool call calls, and its arguments as JSON text."""

    name: Name
    arguments: str


class ChatCompletionMessageToolCall(Answer, forbid_unknown_fields=True):
    """A call of a function tool that the model made."""

    id: CallId
    function: ChatCompletionMessageToolCallFunction
    type: Literal["function"] | UnsetType = UNSET


class ChatCompletionMessage(Answer):
    """The assistant's message of a choice."""

    role: Literal["assistant"]
    content: str | None | UnsetType = UNSET
    refusal: None | UnsetType = UNSET
    tool_calls: list[ChatCompletionMessageToolCall] | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET  # a thinking model's, as llama-server sends it


class ChoiceLogprobs(Answer):
    """The log probabilities of a choice's tokens."""

    content: list[TokenLogprob]
    refusal: None | UnsetType = UNSET


class ChatCompletionChoice(Answer):
    """A choice of a chat completion."""

    index: int
    message: ChatCompletionMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: ChatFinish | None


class ChatCompletionTask(Answer):
    """The task of a chat completion (LMSP's)."""

    id: str
    status: str
    on_restart: Literal["fail"]


class ChatCompletion(Answer):
    """A chat completion, with LMSP's `seed`, `metadata`, `error` and `task`."""

    id: Annotated[str, Meta(pattern="^chatcmpl-")]
    object: Literal["chat.completion"]
    created: Time
    model: str
    choices: list[ChatCompletionChoice]
    usage: CompletionUsage | None
    seed: int | None
    metadata: dict[str, str]
    error: TaskError | None
    task: ChatCompletionTask


class ChatCompletionList(Page):
    """A page of the caller's stored chat completions."""

    data: list[ChatCompletion]


class StoredChatMessage(Answer):
    """A message of a stored chat completion."""

    id: str
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None
    content_parts: None | UnsetType = UNSET
    tool_calls: list[ChatCompletionMessageToolCall] | UnsetType = UNSET
    tool_call_id: (
        Annotated[CallId, Meta(description="The id of a tool call of an assistant message before it.")] | UnsetType
    ) = UNSET


class ChatCompletionMessageList(Page):
    """A page of a stored chat completion's messages."""

    data: list[StoredChatMessage]


class DeletedChatCompletion(Answer):
    """A stored chat completion deleted."""

    id: str
    object: Literal["chat.completion.deleted"]
    deleted: Deleted


class ChatCompletionChunkChoice(Answer):
    """A choice's part in a chunk: what its message adds."""

    index: int
    delta: dict[str, Any]
    logprobs: ChoiceLogprobs | None
    finish_reason: ChatFinish | None


class ChatCompletionChunk(Answer):
    """A chunk of a streamed chat completion."""

    id: Annotated[str, Meta(pattern="^chatcmpl-")]
    object: Literal["chat.completion.chunk"]
    created: Time
    model: str
    choices: list[ChatCompletionChunkChoice]


class LegacyLogprobs(Answer):
    """The log probabilities of a text completion's tokens. The tokens of a prompt that `echo` shows
    have null log probabilities."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class TextCompletionChoice(Answer):
    """A choice of a text completion."""

    index: int
    text: str
    logprobs: LegacyLogprobs | None
    finish_reason: Finish | None


class TextCompletion(Answer):
    """A text completion, or a chunk of a streamed one."""

    id: Annotated[str, Meta(pattern="^cmpl-")]
    object: Literal["text_completion"]
    created: Time
    model: str
    choices: list[TextCompletionChoice]


class Embedding(Answer):
    """The embedding of an input: floats, or with `encoding_format: base64` the base64 of their
    little-endian float32 bytes."""

    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingUsage(Answer):
    """The tokens the inputs took."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Answer):
    """The embeddings of the inputs, in their order."""

    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


#: the answers of OpenAI's endpoints, as the OpenAPI document names them
ANSWERS = (
    ChatCompletion,
    ChatCompletionList,
    ChatCompletionMessageList,
    DeletedChatCompletion,
    ChatCompletionChunk,
    TextCompletion,
    EmbeddingList,
)
