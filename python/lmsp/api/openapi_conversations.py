"""The OpenAPI paths of what continues earlier turns (LMSP B.11): a response's
``input_items``, and the conversations with their items. Their bodies' schemas
are the wire types' (:mod:`lmsp.wire.conversations`,
:mod:`lmsp.wire.conversation_answers`)."""

from __future__ import annotations

from typing import Callable

from lmsp.wire.options import INCLUDE

from .openapi_schemas import JSON, ref, text

Maker = Callable[..., JSON]

ITEM_LIST = {"200": {"description": "A page", "content": {"application/json": {"schema": ref("ItemList")}}}}


def one(name: str, description: str) -> JSON:
    return {"200": {"description": description, "content": {"application/json": {"schema": ref(name)}}}}


def _page_params(param: Maker) -> tuple[JSON, ...]:
    cursor = text(1, 256)
    return (
        param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}),
        param("order", "query", {"enum": ["asc", "desc"], "default": "desc"}),
        param("after", "query", cursor, "The id of the item the page starts after."),
        param("before", "query", cursor, "The id of the item the page ends before."),
        param("include", "query", {"type": "array", "items": {"enum": list(INCLUDE)}}),
    )


def paths(op: Maker, param: Maker, idempotency: JSON, body_errors: tuple[str, ...], path_id: Maker) -> JSON:
    """The paths, made with :mod:`.openapi`'s helpers."""
    return {
        "/v1/responses/{response_id}/input_items": {
            "get": op(
                "The input items of a response",
                ITEM_LIST,
                params=(path_id("response_id", "resp"), *_page_params(param)),
                errors=("400", "404"),
                scope="responses:read",
            )
        },
        **_conversation_paths(op, param, idempotency, body_errors, path_id),
    }


def _conversation_paths(
    op: Maker, param: Maker, idempotency: JSON, body_errors: tuple[str, ...], path_id: Maker
) -> JSON:
    conv_id = path_id("conversation_id", "conv")
    read, write = {"scope": "responses:read"}, {"scope": "responses:write"}
    return {
        "/v1/conversations": {
            "post": op(
                "Create a conversation with its first items (at most 20)",
                one("Conversation", "The conversation"),
                params=(idempotency,),
                body="CreateConversation",
                optional_body=True,
                errors=(*body_errors, "409", "422"),
                **write,
            )
        },
        "/v1/conversations/{conversation_id}": {
            "get": op(
                "A conversation", one("Conversation", "The conversation"), params=(conv_id,), errors=("404",), **read
            ),
            "post": op(
                "Replace a conversation's metadata",
                one("Conversation", "The conversation"),
                params=(conv_id, idempotency),
                body="UpdateConversation",
                errors=(*body_errors, "404", "409", "422"),
                **write,
            ),
            "delete": op(
                "Delete a conversation with its items",
                one("DeletedConversation", "Deleted"),
                params=(conv_id,),
                errors=("404",),
                **write,
            ),
        },
        **_item_paths(op, param, idempotency, body_errors, conv_id),
    }


def _item_paths(op: Maker, param: Maker, idempotency: JSON, body_errors: tuple[str, ...], conv_id: JSON) -> JSON:
    item_id = param("item_id", "path", text(0, 256), "The id of an item of the conversation.")
    read, write = {"scope": "responses:read"}, {"scope": "responses:write"}
    return {
        "/v1/conversations/{conversation_id}/items": {
            "get": op(
                "A page of a conversation's items",
                ITEM_LIST,
                params=(conv_id, *_page_params(param)),
                errors=("400", "404"),
                **read,
            ),
            "post": op(
                "Add items (at most 20) to the end of a conversation",
                ITEM_LIST,
                params=(conv_id, idempotency, _page_params(param)[-1]),
                body="AddConversationItems",
                errors=(*body_errors, "404", "409", "422"),
                **write,
            ),
        },
        "/v1/conversations/{conversation_id}/items/{item_id}": {
            "get": op(
                "An item of a conversation",
                one("Item", "The item"),
                params=(conv_id, item_id, _page_params(param)[-1]),
                errors=("400", "404"),
                **read,
            ),
            "delete": op(
                "Delete an item of a conversation",
                one("Conversation", "The conversation"),
                params=(conv_id, item_id),
                errors=("404",),
                **write,
            ),
        },
    }
