"""A failed response, as the unmodified ``openai`` package sees it: the stream
ends with a ``ResponseFailedEvent`` whose ``response.error`` says why (B.6),
and the response is retrieved like any other."""
from __future__ import annotations

import httpx2
import openai
import pytest
from api_fakes import OWNER
from api_helpers import make_client, parse_sse

ERROR = {"code": "model_load_failed", "message": "model tiny failed to load: unknown architecture"}


@pytest.fixture
def sdk(store, app, scripted):
    def fail_all() -> None:  # a worker that gives up on every task it claims
        for claim in store.claim(OWNER, limit=100, lease=60):
            store.fail_task(claim["task_id"], OWNER, **ERROR)

    scripted.run_queued = fail_all
    _, token = make_client(store, ["responses:write", "responses:read"])
    with httpx2.Client(transport=httpx2.WSGITransport(app=app)) as http:
        yield openai.OpenAI(api_key=token, base_url="http://lmsp.test/v1", max_retries=0, http_client=http)


def test_a_failed_stream_ends_with_its_failed_event(sdk):
    events = list(sdk.responses.create(model="tiny", input="Hello", stream=True))
    assert events[0].type == "response.created"
    last = events[-1]
    assert isinstance(last, openai.types.responses.ResponseFailedEvent)
    assert last.response.status == "failed"
    assert (last.response.error.code, last.response.error.message) == (ERROR["code"], ERROR["message"])


def test_a_failed_response_is_retrieved_and_replayed(sdk):
    created = sdk.responses.create(model="tiny", input="Hello", background=True)
    retrieved = sdk.responses.retrieve(created.id)
    assert retrieved.status == "failed" and retrieved.error.code == ERROR["code"]
    replayed = list(sdk.responses.retrieve(created.id, stream=True, starting_after=0))
    assert isinstance(replayed[-1], openai.types.responses.ResponseFailedEvent)
    assert replayed[-1].response.error.code == ERROR["code"]
    plain = sdk.responses.create(model="tiny", input="Hello")
    assert plain.status == "failed" and plain.error.message == ERROR["message"]


def test_the_failed_event_has_no_top_level_error(user, scripted, store):
    scripted.auto = False
    result = user.post("/v1/responses", json={"model": "tiny", "input": "Hi", "background": True})
    claim = store.claim(OWNER, limit=1, lease=60)[0]
    store.fail_task(claim["task_id"], OWNER, **ERROR)
    frames = parse_sse(user.get(f"/v1/responses/{result.json['id']}", params={"stream": "true"}).text)
    failed = frames[-1]["data"]
    assert failed["type"] == "response.failed" and "error" not in failed
    assert failed["response"]["error"] == ERROR
