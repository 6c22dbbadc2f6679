"""``GET /v1/responses/{id}/input_items`` (LMSP B.11): a page of the items of the
request that made a response (:func:`lmsp.api.common.page_query`)."""

from __future__ import annotations

import falcon

from .common import Deps, check_id, owner_filter, page_query, set_json


class InputItemsResource:
    """``GET /v1/responses/{id}/input_items``: the items of the request that made a
    response (its ``input``; not the context it continued)."""

    scopes = {"GET": "responses:read"}

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def on_get(self, req: falcon.Request, resp: falcon.Response, response_id: str) -> None:
        check_id(response_id, "resp", "response")
        page = page_query(req)
        set_json(resp, self.deps.tasks.input_items(response_id, owner_filter(req), **page))
