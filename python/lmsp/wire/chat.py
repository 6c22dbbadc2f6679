"""A Chat Completions request (LMSP B.11) checked, and the task it makes: its
messages as the prompt takes them, the stored completion's view of them, the
sampling settings, log probabilities, tools and response format."""

from __future__ import annotations

from typing import Annotated, Any, Callable, ClassVar, Literal

from msgspec import Meta

from lmsp import history
from lmsp.contracts import CreateRequest
from lmsp.errors import InvalidRequest
from lmsp.objects import LOGPROBS

from . import chat_tools
from .chat_tools import ChatTool, ChatToolCall, ResponseFormat, ToolChoice
from .input import MAX_MESSAGES, MAX_TEXT
from .openai import (
    ON_RESTART,
    STREAM_OPTIONS_NEED_STREAM,
    Key,
    OpenAIRequest,
    Tokens,
    include_usage,
    sampling_fields,
)
from .options import MAX_TOP_LOGPROBS
from .refusals import nothing_asked, refuse_unsupported
from .structs import JSON, NO_NUL, Body, Metadata, ModelName, read
from .tools import MAX_TOOLS

PREFIX = "chatcmpl-"
REFUSED = (
    "n",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "functions",
    "function_call",
    "modalities",
    "audio",
    "prediction",
    "web_search_options",
    "reasoning_effort",
    "verbosity",
)
# an assistant message's fields that ask for nothing only when null or empty
EMPTY_FIELDS = ("refusal", "function_call", "audio", "annotations")

Text = Annotated[str, Meta(max_length=MAX_TEXT, pattern=NO_NUL)]
#: ``top_logprobs`` only with ``logprobs: true``
TOP_NEEDS_LOGPROBS: JSON = {
    "not": {
        "required": ["top_logprobs"],
        "properties": {"top_logprobs": {"type": "integer"}, "logprobs": {"not": {"const": True}}},
    }
}


class ChatTextPart(Body):
    """A text part of a message's content (the only kind this service reads)."""

    type: Literal["text"]
    text: Text


Content = Text | list[ChatTextPart]


class ChatMessage(Body, tag_field="role"):
    """A message of ``messages``, by its ``role``."""

    #: the role the prompt gives it
    said_as: ClassVar[str] = "user"


class ChatSystemMessage(ChatMessage, tag="system"):
    """The instructions of the conversation."""

    said_as: ClassVar[str] = "system"
    content: Content


class ChatDeveloperMessage(ChatSystemMessage, tag="developer"):
    """The instructions of the conversation (a system message by another name)."""


class ChatUserMessage(ChatMessage, tag="user"):
    """What the user says."""

    content: Content


class ChatAssistantMessage(ChatMessage, tag="assistant"):
    """What the model said before: its text, its tool calls, or both."""

    said_as: ClassVar[str] = "assistant"
    content: Content | None = None
    tool_calls: list[ChatToolCall] | None = None
    reasoning_content: (
        Annotated[Text, Meta(description="An assistant's earlier reasoning, for a template that shows it again.")]
        | None
    ) = None
    # asked for nothing only when null or empty
    refusal: str | None = None
    function_call: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    annotations: list[Any] | None = None

    __schema__: ClassVar[JSON] = {
        "properties": {
            "refusal": {"type": "null"},
            "function_call": {"type": "null"},
            "audio": {"type": "null"},
            "annotations": {"type": "array", "maxItems": 0},
        },
        # content, unless it has tool calls
        "anyOf": [
            {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
            {"required": ["tool_calls"], "properties": {"tool_calls": {"type": "array", "minItems": 1}}},
        ],
    }


class ChatToolMessage(ChatMessage, tag="tool"):
    """The output of a tool call of an assistant message before it."""

    said_as: ClassVar[str] = "tool"
    content: Content
    tool_call_id: Annotated[
        str, Meta(min_length=1, max_length=64, description="The id of a tool call of an assistant message before it.")
    ]


Message = ChatSystemMessage | ChatDeveloperMessage | ChatUserMessage | ChatAssistantMessage | ChatToolMessage


class CreateChatCompletion(OpenAIRequest, kw_only=True):
    """A chat completion of ``messages`` (a task of the store; streamed with ``stream: true``)."""

    model: ModelName
    messages: Annotated[list[Message], Meta(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Tokens | None = None
    safety_identifier: Key | None = None
    prompt_cache_key: Key | None = None
    service_tier: Key | None = None
    metadata: Metadata | None = None
    store: bool | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: Annotated[list[ChatTool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # asked for nothing only at their default (lmsp.wire.refusals)
    functions: list[Any] | None = None
    function_call: str | dict[str, Any] | None = None
    modalities: list[Any] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None

    __schema__: ClassVar[JSON] = {
        "properties": nothing_asked(REFUSED),
        "allOf": [STREAM_OPTIONS_NEED_STREAM, TOP_NEEDS_LOGPROBS],
    }


class UpdateChatCompletion(Body):
    """A stored chat completion's new ``metadata``, which replaces its own (null: none)."""

    metadata: Metadata | None


def _content(content: Content | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part.text for part in content)


def parse_messages(value: list[Message], shown: list[dict[str, Any]] | None = None) -> list[dict[str, str]]:
    """``messages`` as the prompt takes them (calls and their outputs as
    :mod:`lmsp.wire.chat_tools` shows them to the model). Each message as the stored
    completion lists it is appended to ``shown``."""
    out: list[dict[str, str]] = []
    seen: dict[str, str] = {}  # call id -> name, of the tool calls so far
    for i, message in enumerate(value):
        out.extend(_message(message, f"messages[{i}]", seen, shown))
    return out


def _message(
    message: Message, where: str, seen: dict[str, str], shown: list[dict[str, Any]] | None = None
) -> list[dict[str, str]]:
    """One message as the prompt's messages (an assistant message: its reasoning, its
    text, if any, and one per call)."""
    text = _content(message.content)
    calls: list[ChatToolCall] | None = None
    if isinstance(message, ChatToolMessage):
        made = [chat_tools.tool_message(message.tool_call_id, where, text, seen)]
    elif isinstance(message, ChatAssistantMessage):
        calls = _assistant(message, where)
        said = [{"role": "assistant", "content": text}] if text or not calls else []
        reasoning = message.reasoning_content
        made = ([history.reasoning_message(reasoning)] if reasoning else []) + said
        made += chat_tools.tool_call_messages(calls or [], f"{where}.tool_calls", seen)
    else:
        made = [{"role": message.said_as, "content": text}]
    if shown is not None:
        call_id = message.tool_call_id if isinstance(message, ChatToolMessage) else None
        shown.append(chat_tools.stored_message(message.said_as, text, calls, call_id))
    return made


def _assistant(message: ChatAssistantMessage, where: str) -> list[ChatToolCall] | None:
    """An assistant message's tool calls, once its other fields are checked: each field
    of :data:`EMPTY_FIELDS` asks for nothing, and it has content or calls."""
    for name in EMPTY_FIELDS:
        if getattr(message, name) not in (None, []):
            raise InvalidRequest(f"{where}.{name}: this endpoint does not support it", param=f"{where}.{name}")
    if message.content is None and not message.tool_calls:
        raise InvalidRequest(f"{where}.content is required", param=f"{where}.content")
    return message.tool_calls


def parse_logprobs(asked: CreateChatCompletion) -> dict[str, Any]:
    """``logprobs`` and ``top_logprobs`` (only with ``logprobs: true``, as OpenAI
    answers), as the task keeps them: the Responses request's ``include`` and
    ``top_logprobs``, which the engine and the store read."""
    wanted = bool(asked.logprobs)
    if asked.top_logprobs is not None and not wanted:
        raise InvalidRequest("'top_logprobs' is only allowed with 'logprobs': true", param="top_logprobs")
    return {"include": [LOGPROBS] if wanted else [], "top_logprobs": asked.top_logprobs or 0}


def parse_update(body: Any) -> dict[str, str]:
    """An update of a stored chat completion: its new ``metadata``."""
    return dict(read(body, UpdateChatCompletion).metadata or {})


def parse_chat(body: dict[str, Any], config: Any, random_seed: Callable[[], int]) -> CreateRequest:
    """Check a Chat Completions request and make its task; raises InvalidRequest."""
    asked = read(body, CreateChatCompletion)
    refuse_unsupported(asked, REFUSED)
    shown: list[dict[str, Any]] = []
    messages = parse_messages(asked.messages, shown)
    stream, store = bool(asked.stream), bool(asked.store)  # OpenAI's default: not stored
    request = {
        "model": asked.model,
        "input": [dict(m) for m in messages],
        "chat_messages": shown,  # as the stored completion's messages list them
        "instructions": None,
        **sampling_fields(asked, config, random_seed, asked.max_completion_tokens),
        **parse_logprobs(asked),
        "stream": stream,
        "include_usage": include_usage(asked),
        "background": False,
        "store": store,
        "on_restart": ON_RESTART,
        "metadata": dict(asked.metadata or {}),
        "text": chat_tools.parse_response_format(asked.response_format),
        **chat_tools.parse_tool_fields(asked.tools, asked.tool_choice),
        "parallel_tool_calls": asked.parallel_tool_calls is not False,
    }
    return CreateRequest(
        client_id=None,
        model=asked.model,
        messages=messages,
        request=request,
        on_restart=ON_RESTART,
        background=False,
        stream=stream,
        store=store,
        kind="chat.completion",
    )
