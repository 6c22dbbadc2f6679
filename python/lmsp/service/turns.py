"""The earlier turns a new response continues (LMSP B.11): a previous response's
(``previous_response_id``: its context, input and output, not its
``instructions``) or a conversation's items (``conversation``).

A conversation's items are read when the response is created and kept in its
request as the prompt's messages (``context``). A previous response's turns are
kept by reference instead: the store keeps each turn of a chain once, when it
is first continued (``chain_turn``, :mod:`lmsp.store.chains`), and reads them
back whenever the task is claimed, so the prompt of a task never changes after
its creation (a resumed or retried task reads the same one), a response stores
only its own turn however long its chain, and a chain never breaks while its
newest response exists, whatever becomes of the older ones. ``calls`` (call id
-> name) holds the function calls of the request's own input.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lmsp import history
from lmsp.contracts import NO_TURNS, EarlierTurns
from lmsp.errors import ContextLengthExceeded, InvalidRequest, LMSPError, NotFound, TaskUnfinished

from lmsp.wire.input import input_item

MAX_ID = 100
#: a bound on the characters of one token, above the longest token of the vocabularies
#: served: text of more than ``n_ctx * CHARS_PER_TOKEN`` characters never fits a context
#: of ``n_ctx`` tokens
CHARS_PER_TOKEN = 256


class _AnyCall(dict[str, str]):
    """Every call id is known (the calls of a request that is only answered again)."""

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> str:
        return ""


def load(
    store: Any,
    client_id: str,
    body: dict[str, Any],
    idempotency: tuple[str, str] | None = None,
    n_ctx: int | None = None,
) -> EarlierTurns:
    """The context of a create request's body (``n_ctx``: the context of a sequence, which
    bounds what a response keeps of a conversation, :func:`bounded`). An error reading
    it (the previous response or the conversation gone) gives way to the stored answer
    of a request made again with the same ``idempotency`` key."""
    try:
        found = _load(store, client_id, body)
        if n_ctx is not None and found.conversation is not None:
            return replace(found, messages=bounded(found.messages, body.get("truncation") == "auto", n_ctx))
        return found
    except LMSPError:
        replay = None if idempotency is None else store.replay_of(client_id, idempotency)
        if replay is None:
            raise
        return EarlierTurns(calls=_AnyCall(), replay=replay)


def _load(store: Any, client_id: str, body: dict[str, Any]) -> EarlierTurns:
    previous, conversation = body.get("previous_response_id"), body.get("conversation")
    if previous is not None and conversation is not None:
        raise InvalidRequest(
            "'previous_response_id' and 'conversation' cannot be used together", param="previous_response_id"
        )
    if previous is not None:
        return _previous(store, client_id, previous)
    if conversation is not None:
        return _conversation(store, client_id, conversation)
    return NO_TURNS


def _checked_id(value: Any, prefix: str, param: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{param!r} must be the id of a {what}", param=param)
    if not value.startswith(prefix) or len(value) > MAX_ID:  # a wrong prefix can only be an unknown id
        raise NotFound(f"no {what} {value[:MAX_ID]!r}", param=param)
    return value


def _previous(store: Any, client_id: str, value: Any) -> EarlierTurns:
    param = "previous_response_id"
    rid = _checked_id(value, "resp_", param, "response")
    try:
        request = store.get_request(rid, client_id)
        response = store.get_response(rid, client_id)
    except NotFound:  # another client's answers as an unknown id
        raise NotFound(f"no response {rid}", param=param) from None
    if not request.get("store", True):
        raise InvalidRequest(f"response {rid} was not stored ('store': false): it cannot be continued", param=param)
    if response["status"] in ("queued", "in_progress"):
        raise TaskUnfinished(f"response {rid} is still {response['status']}; wait for it to finish", param=param)
    found = store.chain_context(rid)  # its turn is kept already: it was continued before
    if found is not None:
        return EarlierTurns(found[0], found[1], previous_response_id=rid, turn={"response_id": rid})
    parent = None if "context" in request else request.get("previous_response_id")
    earlier = ([], {}) if parent is None else store.chain_context(parent)
    if earlier is None:  # retention took the chain since the response was read
        raise NotFound(f"no response {rid}", param=param)
    messages: list[dict[str, str]] = list(earlier[0])
    calls: dict[str, str] = dict(earlier[1])
    own = list(request.get("context") or ())  # a context kept by value (a conversation's)
    given = request.get("input")
    own += [{"role": "user", "content": given}] if isinstance(given, str) else list(given or ())
    own_calls = dict(request.get("calls") or {})
    for item in response.get("output") or ():
        message = _output_message(item, own_calls)
        if message is not None:
            own.append(message)
    turn = {"response_id": rid, "parent": parent, "messages": own, "calls": own_calls}
    return EarlierTurns(messages + own, {**calls, **own_calls}, previous_response_id=rid, turn=turn)


def _output_message(item: dict[str, Any], calls: dict[str, str]) -> dict[str, str] | None:
    """An output item of a response as the message of a later prompt; None for one
    with nothing to read (a function call cut before its name)."""
    if item.get("type") == "function_call":
        try:
            return input_item(item, "output", calls)
        except InvalidRequest:
            return None
    if item.get("type") == "reasoning":
        text = history.reasoning_text(item)
        return history.reasoning_message(text) if text else None
    if item.get("type") != "message":
        return None
    text = "".join(part.get("text") or part.get("refusal") or "" for part in item.get("content") or ())
    return {"role": "assistant", "content": text}


def _conversation(store: Any, client_id: str, value: Any) -> EarlierTurns:
    param = "conversation"
    if isinstance(value, dict):
        if set(value) - {"id"}:
            raise InvalidRequest("'conversation' must be an id or {\"id\": ...}", param=param)
        value = value.get("id")
    cid = _checked_id(value, "conv_", param, "conversation")
    items, version = store.conversation_items(cid, client_id)
    return EarlierTurns(*item_messages(items), conversation=(cid, version))


def item_messages(items: list[dict[str, Any]]) -> tuple[list[dict[str, str]], dict[str, str]]:
    """The messages of stored items (a conversation's), and the calls made in them."""
    calls: dict[str, str] = {}
    messages = []
    for i, item in enumerate(items):
        known = calls
        if item.get("type") == "function_call_output" and item.get("call_id") not in calls:
            # its call was deleted from the list: the output is read all the same, but a
            # new output of that call answers no call the model sees
            known = {**calls, str(item.get("call_id")): ""}
        try:
            message = input_item(item, f"conversation.items[{i}]", known)
        except InvalidRequest:
            if item.get("type") != "function_call":
                raise
            continue  # a call its response's end cut before its name: nothing to read
        if message is not None:
            messages.append(message)
    return messages, calls


def bounded(messages: list[dict[str, str]], truncate: bool, n_ctx: int) -> list[dict[str, str]]:
    """A conversation's messages as a response keeps them: at most what the model could
    still see. When its newest messages alone are longer than ``n_ctx`` contexts can be
    (:data:`CHARS_PER_TOKEN`), the older ones could never be in the prompt: with
    ``truncate`` (``truncation: "auto"``, which drops the oldest messages but the system
    ones first) they are left out, its system messages kept, and the prompt is the same;
    without it the prompt could never fit, and the request is refused."""
    limit, total = n_ctx * CHARS_PER_TOKEN, 0
    for i in range(len(messages) - 1, -1, -1):
        total += len(messages[i]["content"])
        if total > limit:
            break
    else:
        return messages
    if not truncate:
        raise ContextLengthExceeded(
            f"the conversation's items are longer than a context of {n_ctx} tokens can hold; "
            "use 'truncation': 'auto' or delete some of them",
            param="conversation",
        )
    return [m for m in messages[: i + 1] if m["role"] in ("system", "developer")] + messages[i + 1 :]
