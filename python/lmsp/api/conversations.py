"""Conversations (LMSP B.11): ``/v1/conversations`` and their items.

A conversation is a client's list of items (``conv_...``); a response created
with ``conversation`` reads them as its context and appends its turn
(:mod:`lmsp.store.conversations`). Reads need ``responses:read``, changes
``responses:write``; another client's conversation is unknown (404).
"""

from __future__ import annotations

from typing import Any

import falcon

from lmsp.errors import InvalidRequest
from lmsp.ids import new_id
from lmsp.items import listed_item

from . import idempotency
from .common import Deps, caller, check_id, owner_filter, reject_unknown, set_json
from .context import item_messages
from .input_items import page_query
from .metadata import parse_metadata

MAX_ITEMS = 20  # items in one request, as OpenAI's API


def parse_items(value: Any, *, required: bool, calls: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """``items``: up to :data:`MAX_ITEMS` input items (messages, function calls and their
    outputs, reasoning), checked as a response's input is, as the list keeps them: a
    ``function_call_output`` answers a call before it, in ``items`` or in ``calls`` (call
    id -> name: those of the conversation the items go to)."""
    from .responses import input_item

    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        raise InvalidRequest(
            "'items' must be a non-empty array of items" if required else "'items' must be an array", param="items"
        )
    if len(value) > MAX_ITEMS:
        raise InvalidRequest(f"'items' has more than {MAX_ITEMS} items", param="items")
    known = dict(calls or {})
    out = []
    for i, item in enumerate(value):
        input_item(item, f"items[{i}]", known)
        out.append(listed_item(item, new_id))
    return out


def answers_calls(value: Any) -> bool:
    """Whether ``items`` holds a ``function_call_output`` (whose call may be in the
    conversation already)."""
    return isinstance(value, list) and any(
        isinstance(item, dict) and item.get("type") == "function_call_output" for item in value
    )


class ConversationsResource:
    """``POST /v1/conversations``: a new conversation, with its first items."""

    scopes = {"POST": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = self.deps.body(req, optional=True) or {}
        reject_unknown(body, ("items", "metadata"))
        items = parse_items(body.get("items"), required=False)
        metadata = parse_metadata(body.get("metadata"))
        client_id = caller(req)["id"]

        def act() -> idempotency.Answer:
            return 200, self.deps.store.create_conversation(client_id, metadata, items)

        idempotency.answer(self.deps.store, req, resp, client_id, body, act)


class ConversationResource:
    """``GET``, ``POST`` (its metadata) and ``DELETE /v1/conversations/{id}``."""

    scopes = {"GET": "responses:read", "POST": "responses:write", "DELETE": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, conversation_id: str) -> None:
        check_id(conversation_id, "conv", "conversation")
        set_json(resp, self.deps.store.get_conversation(conversation_id, owner_filter(req)))

    def on_post(self, req: falcon.Request, resp: falcon.Response, conversation_id: str) -> None:
        check_id(conversation_id, "conv", "conversation")
        body = self.deps.body(req)
        reject_unknown(body, ("metadata",))
        if body.get("metadata") is None:
            raise InvalidRequest("'metadata' is required", param="metadata")
        metadata = parse_metadata(body["metadata"])
        owner = owner_filter(req)

        def act() -> idempotency.Answer:
            return 200, self.deps.store.update_conversation(conversation_id, metadata, owner)

        idempotency.answer(self.deps.store, req, resp, caller(req)["id"], body, act)

    def on_delete(self, req: falcon.Request, resp: falcon.Response, conversation_id: str) -> None:
        check_id(conversation_id, "conv", "conversation")
        set_json(resp, self.deps.store.delete_conversation(conversation_id, owner_filter(req)))


class ConversationItemsResource:
    """``GET`` (a page) and ``POST`` (up to 20 more) ``/v1/conversations/{id}/items``."""

    scopes = {"GET": "responses:read", "POST": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, conversation_id: str) -> None:
        check_id(conversation_id, "conv", "conversation")
        page = page_query(req)
        set_json(resp, self.deps.store.list_conversation_items(conversation_id, owner_filter(req), **page))

    def on_post(self, req: falcon.Request, resp: falcon.Response, conversation_id: str) -> None:
        check_id(conversation_id, "conv", "conversation")
        page_query(req)  # its include
        body = self.deps.body(req)
        reject_unknown(body, ("items",))
        owner = owner_filter(req)
        calls: dict[str, str] = {}
        version = None  # the conversation's calls were not read
        if answers_calls(body.get("items")):  # the calls of the conversation, as a response reads them
            stored, version = self.deps.store.conversation_items(conversation_id, owner)
            calls = item_messages(stored)[1]
        items = parse_items(body.get("items"), required=True, calls=calls)

        def act() -> idempotency.Answer:
            return 200, self.deps.store.add_conversation_items(conversation_id, items, owner, version=version)

        idempotency.answer(self.deps.store, req, resp, caller(req)["id"], body, act)


class ConversationItemResource:
    """``GET`` and ``DELETE /v1/conversations/{id}/items/{item_id}``; a deletion answers
    the conversation."""

    scopes = {"GET": "responses:read", "DELETE": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, conversation_id: str, item_id: str) -> None:
        check_id(conversation_id, "conv", "conversation")
        page_query(req)  # its include
        set_json(resp, self.deps.store.get_conversation_item(conversation_id, item_id, owner_filter(req)))

    def on_delete(self, req: falcon.Request, resp: falcon.Response, conversation_id: str, item_id: str) -> None:
        check_id(conversation_id, "conv", "conversation")
        set_json(resp, self.deps.store.delete_conversation_item(conversation_id, item_id, owner_filter(req)))
