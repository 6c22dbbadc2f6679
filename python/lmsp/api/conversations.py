"""Conversations (LMSP B.11): ``/v1/conversations`` and their items.

A conversation is a client's list of items (``conv_...``); a response created
with ``conversation`` reads them as its context and appends its turn
(:mod:`lmsp.store.conversations`). Reads need ``responses:read``, changes
``responses:write``; another client's conversation is unknown (404).
"""

from __future__ import annotations

import falcon

from lmsp.service.keys import Answer
from lmsp.wire.conversations import answers_calls, parse_items, parse_new, parse_update, read_added

from . import idempotency
from .common import Deps, caller, check_id, owner_filter, page_query, set_json


class ConversationsResource:
    """``POST /v1/conversations``: a new conversation, with its first items."""

    scopes = {"POST": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = self.deps.body(req, optional=True) or {}
        items, metadata = parse_new(body)
        client_id = caller(req)["id"]

        def act() -> Answer:
            return 200, self.deps.conversations.create(client_id, metadata, items)

        idempotency.answer(self.deps.keys, req, resp, client_id, body, act)


class ConversationResource:
    """``GET``, ``POST`` (its metadata) and ``DELETE /v1/conversations/{id}``."""

    scopes = {"GET": "responses:read", "POST": "responses:write", "DELETE": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, conversation_id: str) -> None:
        check_id(conversation_id, "conv", "conversation")
        set_json(resp, self.deps.conversations.get(conversation_id, owner_filter(req)))

    def on_post(self, req: falcon.Request, resp: falcon.Response, conversation_id: str) -> None:
        check_id(conversation_id, "conv", "conversation")
        body = self.deps.body(req)
        metadata = parse_update(body)
        owner = owner_filter(req)

        def act() -> Answer:
            return 200, self.deps.conversations.update(conversation_id, metadata, owner)

        idempotency.answer(self.deps.keys, req, resp, caller(req)["id"], body, act)

    def on_delete(self, req: falcon.Request, resp: falcon.Response, conversation_id: str) -> None:
        check_id(conversation_id, "conv", "conversation")
        set_json(resp, self.deps.conversations.delete(conversation_id, owner_filter(req)))


class ConversationItemsResource:
    """``GET`` (a page) and ``POST`` (up to 20 more) ``/v1/conversations/{id}/items``."""

    scopes = {"GET": "responses:read", "POST": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, conversation_id: str) -> None:
        check_id(conversation_id, "conv", "conversation")
        page = page_query(req)
        set_json(resp, self.deps.conversations.items(conversation_id, owner_filter(req), **page))

    def on_post(self, req: falcon.Request, resp: falcon.Response, conversation_id: str) -> None:
        check_id(conversation_id, "conv", "conversation")
        page_query(req)  # its include
        body = self.deps.body(req)
        given = read_added(body)
        owner = owner_filter(req)
        calls: dict[str, str] = {}
        version = None  # the conversation's calls were not read
        if answers_calls(given):  # the calls of the conversation, as a response reads them
            calls, version = self.deps.conversations.calls(conversation_id, owner)
        items = parse_items(given, calls=calls)

        def act() -> Answer:
            return 200, self.deps.conversations.add_items(conversation_id, items, owner, version)

        idempotency.answer(self.deps.keys, req, resp, caller(req)["id"], body, act)


class ConversationItemResource:
    """``GET`` and ``DELETE /v1/conversations/{id}/items/{item_id}``; a deletion answers
    the conversation."""

    scopes = {"GET": "responses:read", "DELETE": "responses:write"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, conversation_id: str, item_id: str) -> None:
        check_id(conversation_id, "conv", "conversation")
        page_query(req)  # its include
        set_json(resp, self.deps.conversations.item(conversation_id, item_id, owner_filter(req)))

    def on_delete(self, req: falcon.Request, resp: falcon.Response, conversation_id: str, item_id: str) -> None:
        check_id(conversation_id, "conv", "conversation")
        set_json(resp, self.deps.conversations.delete_item(conversation_id, item_id, owner_filter(req)))
