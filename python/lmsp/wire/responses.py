"""A Responses request (LMSP B.5): its wire type, every field declared, and the
task it makes, with the defaults filled."""

from __future__ import annotations

from typing import Annotated, Any, Callable, ClassVar, Literal, Union

from msgspec import Meta

from lmsp.contracts import NO_TURNS, CreateRequest, EarlierTurns
from lmsp.errors import InvalidRequest
from lmsp.ids import new_id
from lmsp.items.listed import input_items

from . import options, tools
from .input import ITEM_SCHEMA, MAX_MESSAGES, MAX_TEXT, Text, parse_messages
from .options import ContinuedConversation, ContinuedId, explained
from .tools import TextOptions, ToolChoice, Tools
from .structs import INT32_MAX, JSON, NO_NUL, REF, Body, Metadata, ModelName, Seed, Stop, read

Input = Union[
    Annotated[str, Meta(max_length=MAX_TEXT, pattern=NO_NUL)],
    Annotated[list[Any], Meta(min_length=1, max_length=MAX_MESSAGES)],
]
REASONS = {**options.REASONS, **tools.REASONS}
_TEXT: JSON = {"type": "string", "maxLength": MAX_TEXT, "pattern": NO_NUL}
_PROMPT_ITEM: JSON = {"anyOf": [{"$ref": REF.format(name=name)} for name in ("InputMessage", "InputFunctionCall")]}


class CreateResponse(Body):
    """A request for a response: the model, its input (a text, or input items of which
    one at least is a message or a function call), how to sample, and how its task runs."""

    model: ModelName
    input: Input
    instructions: Text | None = None
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=0, le=INT32_MAX)] | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    stream: bool | None = None
    background: bool | None = None
    store: bool | None = None
    on_restart: Literal["fail", "retry", "resume"] | None = None
    metadata: Metadata | None = None
    include: list[options.Include] | None = None
    top_logprobs: options.TopLogprobs | None = None
    truncation: options.Truncation | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: options.MaxToolCalls | None = None
    user: options.Key | None = None
    safety_identifier: options.Key | None = None
    prompt_cache_key: options.Key | None = None
    service_tier: options.ServiceTier | None = None
    stream_options: options.ResponseStreamOptions | None = None
    presence_penalty: options.Zero | None = None
    frequency_penalty: options.Zero | None = None
    reasoning: options.ReasoningOptions | None = None
    previous_response_id: ContinuedId | None = None
    conversation: ContinuedId | ContinuedConversation | None = None
    prompt: Annotated[None, Meta(description="Stored prompt templates are not supported.")] = None
    text: TextOptions | None = None
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None

    __schema__: ClassVar[JSON] = {
        "properties": {
            "input": {
                "anyOf": [
                    _TEXT,
                    {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": MAX_MESSAGES,
                        "items": ITEM_SCHEMA,
                        "contains": _PROMPT_ITEM,  # a reasoning item alone makes no prompt
                    },
                ]
            }
        },
        # a background response must be stored
        "not": {
            "required": ["background", "store"],
            "properties": {"background": {"const": True}, "store": {"const": False}},
        },
    }


def parse_create(
    body: dict[str, Any], config: Any, random_seed: Callable[[], int], earlier: EarlierTurns = NO_TURNS
) -> CreateRequest:
    """Check every field of B.5 and fill the defaults (``earlier``: the turns it continues)."""
    try:
        asked = read(body, CreateResponse)
    except InvalidRequest as e:
        raise _refusal(e) from None
    if asked.background and asked.store is False:
        raise InvalidRequest("a background response must be stored ('store' cannot be false)", param="store")
    calls = earlier.calls if earlier.replay is not None else dict(earlier.calls)  # those of the input added
    messages = parse_messages(asked.input, calls)
    # what the task keeps of the input: the messages as checked, each content one text
    given = asked.input if isinstance(asked.input, str) else [dict(m) for m in messages]
    messages = earlier.messages + messages
    if asked.instructions is not None:  # an empty one is an empty system message
        messages.insert(0, {"role": "system", "content": asked.instructions})
    on_restart = asked.on_restart or config.default_on_restart
    request = {
        "model": asked.model,
        "input": given,
        **_sampling(asked, config, random_seed),
        "stream": bool(asked.stream),
        "background": bool(asked.background),
        "store": asked.store is not False,
        "on_restart": on_restart,
        "metadata": asked.metadata or {},
        **_options(asked),
        "text": tools.text_kept(asked.text),
        **_tool_fields(asked),
        **earlier.fields(calls),
    }
    return CreateRequest(
        client_id=None,
        model=asked.model,
        messages=messages,
        request=request,
        on_restart=on_restart,
        background=request["background"],
        stream=request["stream"],
        store=request["store"],
        items=input_items(body["input"], new_id),
        conversation=earlier.conversation,
    )


def _refusal(error: InvalidRequest) -> InvalidRequest:
    """The refusal of a field its type refuses: with the reason of a feature this service
    lacks."""
    return explained(error, REASONS)


def _sampling(asked: CreateResponse, config: Any, random_seed: Callable[[], int]) -> dict[str, Any]:
    """The instructions and how to sample, as the task keeps them."""
    max_output = config.max_output_tokens if asked.max_output_tokens is None else asked.max_output_tokens
    return {
        "instructions": asked.instructions,
        "max_output_tokens": min(max_output, config.max_output_tokens_cap),
        "temperature": 1.0 if asked.temperature is None else asked.temperature,
        "top_p": 1.0 if asked.top_p is None else asked.top_p,
        "top_k": asked.top_k or 0,
        "seed": random_seed() if asked.seed is None else asked.seed,
        "stop": [asked.stop] if isinstance(asked.stop, str) else list(asked.stop or ()),
    }


def _options(asked: CreateResponse) -> dict[str, Any]:
    """The Open Responses options (:mod:`lmsp.wire.options`) as the task keeps them."""
    return {
        "include": list(dict.fromkeys(asked.include or ())),
        "top_logprobs": asked.top_logprobs or 0,
        "truncation": asked.truncation or "disabled",
        "parallel_tool_calls": asked.parallel_tool_calls is not False,
        "max_tool_calls": asked.max_tool_calls,
        "user": asked.user,
        "safety_identifier": asked.safety_identifier,
        "prompt_cache_key": asked.prompt_cache_key,
        "service_tier": "default",  # the one tier this service has, which "auto" picks
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "reasoning": options.reasoning_kept(asked.reasoning),
    }


def _tool_fields(asked: CreateResponse) -> dict[str, Any]:
    kept = tools.tools_kept(asked.tools)
    return {"tools": kept, "tool_choice": tools.choice_kept(asked.tool_choice, kept)}
