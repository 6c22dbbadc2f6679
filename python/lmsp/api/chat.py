"""OpenAI's Chat Completions (LMSP B.11): ``POST /v1/chat/completions`` as a
task of the store, and the stored completions (``store: true``) read, listed
and deleted as in OpenAI's API.

:func:`parse_chat` checks a request and makes the task; the resources only
read the request and write the answer (the flow is
:mod:`lmsp.api.openai_tasks`'s, the shapes :mod:`lmsp.api.openai_shapes`').
"""

from __future__ import annotations

from typing import Any, Callable

import falcon

from lmsp import calls as call_format
from lmsp import history
from lmsp.errors import InvalidRequest, NotFound
from lmsp.objects import LOGPROBS

from . import chat_tools, idempotency
from .common import (
    Deps,
    caller,
    get_bool,
    get_int,
    get_number,
    get_str,
    owner_filter,
    query_str,
    query_int,
    reject_unknown,
    set_json,
)
from .openai_refusals import refuse_unsupported
from .openai_shapes import ChunkFraming, chat_completion
from .openai_tasks import ON_RESTART, post_task
from .response_options import MAX_TOP_LOGPROBS
from .responses import MAX_MESSAGES, MAX_TEXT, SEED_MAX, CreateRequest, ResponsesService, parse_metadata, parse_stop

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
    and their outputs as :mod:`lmsp.api.chat_tools` shows them to the model). Each
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


def _max_tokens(body: dict[str, Any], config: Any) -> int:
    given = get_int(body, "max_completion_tokens", minimum=1)
    if given is None:
        given = get_int(body, "max_tokens", minimum=1)
    return int(min(config.max_output_tokens if given is None else given, config.max_output_tokens_cap))


def include_usage(body: dict[str, Any], stream: bool) -> bool:
    """``stream_options.include_usage`` (only with ``stream``, as in OpenAI)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise InvalidRequest("'stream_options' is only allowed with 'stream': true", param="stream_options")
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    reject_unknown(options, ("include_usage", "include_obfuscation"), where="stream_options.")
    if options.get("include_obfuscation"):
        raise InvalidRequest(
            "'stream_options.include_obfuscation': this endpoint does not pad its chunks",
            param="stream_options.include_obfuscation",
        )
    return bool(get_bool(options, "include_usage", param="stream_options.include_usage"))


def sampling_fields(body: dict[str, Any], config: Any, random_seed: Callable[[], int]) -> dict[str, Any]:
    """The sampling settings that Chat Completions and Completions share, checked, as the
    task keeps them (the names of the Responses request, which the engine reads)."""
    seed = get_int(body, "seed", minimum=0, maximum=SEED_MAX)
    return {
        "max_output_tokens": _max_tokens(body, config),
        "temperature": get_number(body, "temperature", default=1.0, minimum=0, maximum=2),
        "top_p": get_number(body, "top_p", default=1.0, exclusive_minimum=0, maximum=1),
        "top_k": get_int(body, "top_k", default=0, minimum=0, maximum=2**31 - 1),  # LMSP's, as llama-server's
        "seed": random_seed() if seed is None else seed,
        "stop": parse_stop(body.get("stop")),
    }


def parse_logprobs(body: dict[str, Any]) -> dict[str, Any]:
    """``logprobs`` and ``top_logprobs`` (0 to 20, only with ``logprobs: true``, as OpenAI
    answers), as the task keeps them: the Responses request's ``include`` and
    ``top_logprobs``, which the engine and the store read."""
    wanted = bool(get_bool(body, "logprobs"))
    top = get_int(body, "top_logprobs", minimum=0, maximum=MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise InvalidRequest("'top_logprobs' is only allowed with 'logprobs': true", param="top_logprobs")
    return {"include": [LOGPROBS] if wanted else [], "top_logprobs": top or 0}


def asked_logprobs(request: dict[str, Any]) -> bool:
    """Whether a task's request asked for log probabilities."""
    return LOGPROBS in (request.get("include") or ())


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


def metadata_filter(req: falcon.Request) -> dict[str, str]:
    """The list's ``metadata[key]=value`` query parameters (OpenAI's filter), each pair
    one the listed completions' metadata must have."""
    wanted = {}
    for name in req.params:
        if not name.startswith("metadata"):
            continue
        key = name[len("metadata[") : -1] if name.startswith("metadata[") and name.endswith("]") else ""
        if not key:
            raise InvalidRequest("filter by metadata as metadata[key]=value", param=name)
        wanted[key] = query_str(req, name) or ""
    return parse_metadata(wanted) if wanted else {}


def check_chat_id(value: str) -> str:
    if not value.startswith(PREFIX) or len(value) > 100:
        raise NotFound(f"no chat completion with id {value!r}")
    return value


def stored_completion(
    deps: Deps, completion_id: str, req: falcon.Request, response: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A stored chat completion (``response``: its Response object, when read already),
    with the log probabilities its request asked for."""
    owner = owner_filter(req)
    if response is None:
        response = deps.store.get_response(completion_id, owner)
    try:
        asked = asked_logprobs(deps.store.get_request(completion_id, owner))
    except NotFound:  # a listed one deleted since the list was read: shown as it was read
        asked = False
    return chat_completion(response, asked)


class ChatCompletionsResource:
    """``POST /v1/chat/completions`` and the list of stored ones (``GET``)."""

    scopes = {"POST": "responses:write", "GET": "responses:read"}

    def __init__(self, deps: Deps, service: ResponsesService) -> None:
        self.deps = deps
        self.service = service

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        deps = self.deps
        body = deps.body(req)
        parsed = parse_chat(body, deps.config, deps.random_seed)
        usage = bool(parsed.request["include_usage"])
        logprobs = asked_logprobs(parsed.request)
        calls = call_format.mode(parsed.request) is not None
        try:
            post_task(
                deps,
                self.service,
                req,
                resp,
                body,
                parsed,
                lambda response: chat_completion(response, logprobs),
                lambda created: ChunkFraming(
                    "chat.completion", created, include_usage=usage, logprobs=logprobs, calls=calls
                ),
            )
        except InvalidRequest as exc:  # the runtime's refusal of a schema, named as this request names it
            raise chat_tools.chat_param(exc) from None

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        limit = query_int(req, "limit", default=20, minimum=1, maximum=100)
        order = query_str(req, "order", choices=("asc", "desc")) or "asc"
        after = query_str(req, "after")
        if after is not None and not after.startswith(PREFIX):
            raise InvalidRequest(f"'after' must be an id starting with {PREFIX}", param="after")
        page = self.deps.store.list_responses(
            owner_filter(req),
            limit=limit,
            after=after,
            prefix=PREFIX,
            model=query_str(req, "model"),
            oldest_first=order == "asc",
            metadata=metadata_filter(req),
        )
        page["data"] = [stored_completion(self.deps, r["id"], req, r) for r in page["data"]]
        set_json(resp, page)


class ChatCompletionResource:
    """``GET``, ``POST`` (OpenAI's update: its ``metadata``) and ``DELETE
    /v1/chat/completions/{id}``."""

    scopes = {"GET": "responses:read", "POST": "responses:write", "DELETE": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, completion_id: str) -> None:
        check_chat_id(completion_id)
        set_json(resp, stored_completion(self.deps, completion_id, req))

    def on_post(self, req: falcon.Request, resp: falcon.Response, completion_id: str) -> None:
        check_chat_id(completion_id)
        body = self.deps.body(req)
        reject_unknown(body, ("metadata",))
        if "metadata" not in body:
            raise InvalidRequest("'metadata' is required: it is what an update changes", param="metadata")
        metadata = parse_metadata(body["metadata"])

        def update() -> idempotency.Answer:
            self.deps.store.update_metadata(completion_id, metadata, owner_filter(req))
            return 200, stored_completion(self.deps, completion_id, req)

        # an Idempotency-Key keeps the answer for a retry (B.8)
        idempotency.answer(self.deps.store, req, resp, caller(req)["id"], body, update)

    def on_delete(self, req: falcon.Request, resp: falcon.Response, completion_id: str) -> None:
        check_chat_id(completion_id)
        self.deps.store.delete_response(completion_id, owner_filter(req))
        set_json(resp, {"id": completion_id, "object": "chat.completion.deleted", "deleted": True})


class ChatCompletionMessagesResource:
    """``GET /v1/chat/completions/{id}/messages``: a stored completion's messages as
    OpenAI lists them (each content one text, an assistant's ``tool_calls``, a tool
    message's ``tool_call_id``), oldest first unless ``order=desc``."""

    scopes = {"GET": "responses:read"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, completion_id: str) -> None:
        check_chat_id(completion_id)
        limit = query_int(req, "limit", default=20, minimum=1, maximum=100)
        order = query_str(req, "order", choices=("asc", "desc")) or "asc"
        after = query_str(req, "after")
        request = self.deps.store.get_request(completion_id, owner_filter(req))
        given = request.get("chat_messages") or request.get("input") or []  # input: kept before calls were
        messages = [{"id": f"{completion_id}-{i}", **m, "content_parts": None} for i, m in enumerate(given)]
        if order == "desc":
            messages.reverse()
        ids = [m["id"] for m in messages]
        if after is not None:
            if after not in ids:
                raise InvalidRequest("'after' must be the id of one of the completion's messages", param="after")
            messages = messages[ids.index(after) + 1 :]
        data = messages[:limit]
        set_json(
            resp,
            {
                "object": "list",
                "data": data,
                "has_more": len(messages) > limit,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
            },
        )
