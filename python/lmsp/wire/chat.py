"""A Chat Completions request (LMSP B.11) checked, and the task it makes: its
messages as the prompt takes them, the stored completion's view of them, the
sampling settings, log probabilities, tools and response format."""

from __future__ import annotations

from typing import Any, Callable

from lmsp import history
from lmsp.contracts import CreateRequest
from lmsp.errors import InvalidRequest
from lmsp.objects import LOGPROBS

from . import chat_tools
from .fields import get_bool, get_int, get_str, reject_unknown
from .input import MAX_MESSAGES, MAX_TEXT
from .metadata import parse_metadata
from .openai import ON_RESTART, include_usage, sampling_fields
from .options import MAX_TOP_LOGPROBS
from .refusals import refuse_unsupported

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
ACCEPTED = (
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "seed",
    "logprobs",
    "top_logprobs",
    "stream",
    "stream_options",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "parallel_tool_calls",
    "tools",
    "tool_choice",
    "response_format",
    "metadata",
    "store",
)
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# a message's fields besides role and content (each but those of CARRIED asks for
# nothing only when null or empty)
EMPTY_FIELDS = {
    "assistant": ("refusal", "tool_calls", "function_call", "audio", "annotations", "reasoning_content"),
    "tool": ("tool_call_id",),
}
CARRIED = ("tool_calls", "tool_call_id", "reasoning_content")


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string or an array of text parts", param=where)
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise InvalidRequest(f"{at} must be an object", param=at)
        if part.get("type") != "text":
            raise InvalidRequest(
                f"{at}.type must be 'text': only text content is supported, not {part.get('type')!r}",
                param=f"{at}.type",
            )
        reject_unknown(part, ("type", "text"), where=f"{at}.")
        texts.append(get_str(part, "text", required=True, allow_empty=True, max_len=MAX_TEXT, param=f"{at}.text"))
    return "".join(texts)


def parse_messages(value: Any, shown: list[dict[str, Any]] | None = None) -> list[dict[str, str]]:
    """``messages``: a non-empty array of system, developer, user, assistant (with text
    content, tool calls or both) and tool messages, as the prompt takes them (calls
    and their outputs as :mod:`lmsp.wire.chat_tools` shows them to the model). Each
    message as the stored completion lists it is appended to ``shown``."""
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'messages' must be a non-empty array of messages", param="messages")
    if len(value) > MAX_MESSAGES:
        raise InvalidRequest(f"'messages' has more than {MAX_MESSAGES} messages", param="messages")
    out: list[dict[str, str]] = []
    seen: dict[str, str] = {}  # call id -> name, of the tool calls so far
    for i, message in enumerate(value):
        out.extend(_message(message, f"messages[{i}]", seen, shown))
    return out


def _message(
    message: Any, where: str, seen: dict[str, str], shown: list[dict[str, Any]] | None = None
) -> list[dict[str, str]]:
    """One message as the prompt's messages (an assistant message: its reasoning, its
    text, if any, and one per call)."""
    if not isinstance(message, dict):
        raise InvalidRequest(f"{where} must be an object with 'role' and 'content'", param=where)
    role = message.get("role")
    if role not in ROLES and role != "tool":
        raise InvalidRequest(f"{where}.role must be one of {', '.join(ROLES)}, tool", param=f"{where}.role")
    extra = EMPTY_FIELDS.get(role, ())
    reject_unknown(message, ("role", "content", *extra), where=f"{where}.")
    for name in extra:
        if name not in CARRIED and message.get(name) not in (None, []):
            raise InvalidRequest(f"{where}.{name}: this endpoint does not support it", param=f"{where}.{name}")
    calls = message.get("tool_calls") or []
    if message.get("content") is None and not calls:
        raise InvalidRequest(f"{where}.content is required", param=f"{where}.content")
    text = "" if message.get("content") is None else _content(message["content"], f"{where}.content")
    if "\x00" in text:
        raise InvalidRequest(f"{where}.content must not contain NUL characters", param=f"{where}.content")
    if role == "tool":
        made = [chat_tools.tool_message(message, where, text, seen)]
    else:
        said = [{"role": ROLES[role], "content": text}] if text or not calls else []
        made = _reasoning(message, where) + said
        made += chat_tools.tool_call_messages(calls, f"{where}.tool_calls", seen)
    if shown is not None:
        shown.append(chat_tools.stored_message(message, ROLES.get(role, "tool"), text))
    return made


def _reasoning(message: dict[str, Any], where: str) -> list[dict[str, str]]:
    """An assistant message's ``reasoning_content`` (as llama-server takes it) as a
    reasoning message before it (:mod:`lmsp.history`); none when it has none."""
    given = message.get("reasoning_content")
    if given is None or given == "":
        return []
    at = f"{where}.reasoning_content"
    if not isinstance(given, str) or "\x00" in given or len(given) > MAX_TEXT:
        raise InvalidRequest(f"{at} must be a string of at most {MAX_TEXT} characters, without NUL", param=at)
    return [history.reasoning_message(given)]


def parse_logprobs(body: dict[str, Any]) -> dict[str, Any]:
    """``logprobs`` and ``top_logprobs`` (0 to 20, only with ``logprobs: true``, as OpenAI
    answers), as the task keeps them: the Responses request's ``include`` and
    ``top_logprobs``, which the engine and the store read."""
    wanted = bool(get_bool(body, "logprobs"))
    top = get_int(body, "top_logprobs", minimum=0, maximum=MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise InvalidRequest("'top_logprobs' is only allowed with 'logprobs': true", param="top_logprobs")
    return {"include": [LOGPROBS] if wanted else [], "top_logprobs": top or 0}


def parse_chat(body: dict[str, Any], config: Any, random_seed: Callable[[], int]) -> CreateRequest:
    """Check a Chat Completions request and make its task; raises InvalidRequest."""
    reject_unknown(body, ACCEPTED + REFUSED)
    refuse_unsupported(body, REFUSED)
    model = get_str(body, "model", required=True, max_len=256)
    if "messages" not in body:
        raise InvalidRequest("'messages' is required", param="messages")
    shown: list[dict[str, Any]] = []
    messages = parse_messages(body["messages"], shown)
    stream = get_bool(body, "stream")
    store = get_bool(body, "store")  # OpenAI's default: not stored
    for name in ("user", "safety_identifier", "prompt_cache_key", "service_tier"):
        get_str(body, name, allow_empty=True, max_len=512)
    request = {
        "model": model,
        "input": [dict(m) for m in messages],
        "chat_messages": shown,  # as the stored completion's messages list them
        "instructions": None,
        **sampling_fields(body, config, random_seed),
        **parse_logprobs(body),
        "stream": stream,
        "include_usage": include_usage(body, stream),
        "background": False,
        "store": store,
        "on_restart": ON_RESTART,
        "metadata": parse_metadata(body.get("metadata")),
        "text": chat_tools.parse_response_format(body.get("response_format")),
        **chat_tools.parse_tool_fields(body),
        "parallel_tool_calls": get_bool(body, "parallel_tool_calls", default=True),
    }
    return CreateRequest(
        client_id=None,
        model=model,
        messages=messages,
        request=request,
        on_restart=ON_RESTART,
        background=False,
        stream=stream,
        store=store,
        kind="chat.completion",
    )
