"""``GET /v1/responses/{id}/input_items`` (LMSP B.11), and the query of a page of
items that it shares with a conversation's items: ``after``, ``before`` (item
ids of the list), ``limit`` (1-100, default 20) and ``order`` (``asc`` or
``desc``, default ``desc``, as OpenAI's API)."""

from __future__ import annotations

from typing import Any

import falcon

from lmsp.errors import InvalidRequest

from .common import Deps, check_id, owner_filter, query_int, query_str, set_json
from .response_options import parse_include

MAX_CURSOR = 256


def page_query(req: falcon.Request) -> dict[str, Any]:
    """The page a list request asks for: ``after``, ``before``, ``limit``, ``order``;
    ``include`` is checked (the items listed carry all there is)."""
    out: dict[str, Any] = {
        "limit": query_int(req, "limit", default=20, minimum=1, maximum=100),
        "order": query_str(req, "order", choices=("asc", "desc"), default="desc"),
    }
    for name in ("after", "before"):
        value = query_str(req, name)
        if value is not None and not 0 < len(value) <= MAX_CURSOR:
            raise InvalidRequest(f"query parameter {name!r} must be an item id", param=name)
        out[name] = value
    include = req.get_param_as_list("include") or req.get_param_as_list("include[]")
    parse_include(include)
    return out


class InputItemsResource:
    """``GET /v1/responses/{id}/input_items``: the items of the request that made a
    response (its ``input``; not the context it continued)."""

    scopes = {"GET": "responses:read"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, response_id: str) -> None:
        check_id(response_id, "resp", "response")
        page = page_query(req)
        set_json(resp, self.deps.store.list_input_items(response_id, owner_filter(req), **page))
