"""``GET /v1/responses/{id}/input_items`` (LMSP B.11) with the scripted worker:
the items of the request with their ids, pages, isolation and bad queries."""
from __future__ import annotations

import pytest
from api_helpers import assert_error

FIVE = [{"role": "user", "content": f"m{i}"} for i in range(5)]


def made(api, **fields) -> dict:
    body = {"model": "tiny", "input": FIVE}
    body.update(fields)
    result = api.post("/v1/responses", json=body)
    assert result.status_code == 200, result.text
    return result.json


def texts(page: dict) -> list[str]:
    return [item["content"][0]["text"] for item in page["data"]]


def test_the_items_of_the_request_with_their_ids_newest_first(user):
    rid = made(user)["id"]
    page = user.get(f"/v1/responses/{rid}/input_items").json
    assert page["object"] == "list" and page["has_more"] is False
    assert texts(page) == ["m4", "m3", "m2", "m1", "m0"]
    first = page["data"][-1]
    assert first["id"].startswith("msg_") and first["type"] == "message" and first["role"] == "user"
    assert first["status"] == "completed" and first["content"] == [{"type": "input_text", "text": "m0"}]
    assert page["first_id"] == page["data"][0]["id"] and page["last_id"] == first["id"]
    assert len({item["id"] for item in page["data"]}) == 5
    again = user.get(f"/v1/responses/{rid}/input_items").json
    assert again == page  # the ids are kept


def test_a_string_input_is_one_user_message_and_given_ids_are_kept(user):
    rid = made(user, input="hello")["id"]
    data = user.get(f"/v1/responses/{rid}/input_items").json["data"]
    assert [(d["role"], d["content"][0]["text"]) for d in data] == [("user", "hello")]
    echoed = {"type": "message", "id": "msg_given", "role": "assistant", "status": "completed",
              "content": [{"type": "output_text", "text": "hi", "annotations": []}]}
    tools = [{"type": "function", "name": "f"}]
    items = [{"role": "user", "content": "q"}, echoed,
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "42"}]
    rid = made(user, input=items, tools=tools)["id"]
    data = user.get(f"/v1/responses/{rid}/input_items?order=asc").json["data"]
    assert data[1] == echoed
    assert data[2]["id"].startswith("fc_") and data[2]["call_id"] == "c1" and data[2]["status"] == "completed"
    assert data[3]["id"].startswith("fco_") and data[3]["output"] == "42"


def test_pages_forward_and_back(user):
    rid = made(user)["id"]
    url = f"/v1/responses/{rid}/input_items"
    one = user.get(url + "?limit=2&order=asc").json
    assert texts(one) == ["m0", "m1"] and one["has_more"] is True
    two = user.get(url + f"?limit=2&order=asc&after={one['last_id']}").json
    assert texts(two) == ["m2", "m3"] and two["has_more"] is True
    three = user.get(url + f"?limit=2&order=asc&after={two['last_id']}").json
    assert texts(three) == ["m4"] and three["has_more"] is False
    back = user.get(url + f"?order=desc&after={two['first_id']}").json
    assert texts(back) == ["m1", "m0"]
    between = user.get(url + f"?order=asc&after={one['first_id']}&before={three['first_id']}").json
    assert texts(between) == ["m1", "m2", "m3"]
    before = user.get(url + f"?order=asc&before={one['last_id']}").json
    assert texts(before) == ["m0"]
    last = user.get(url + f"?order=asc&after={three['first_id']}").json
    assert last["data"] == [] and last["first_id"] is None and last["has_more"] is False
    assert texts(user.get(url + "?limit=100").json)[0] == "m4"


@pytest.mark.parametrize("query,param", [
    ("limit=0", "limit"), ("limit=101", "limit"), ("limit=x", "limit"), ("order=up", "order"),
    ("after=msg_unknown", "after"), ("before=nope", "before"), ("include=file_search_call.results", "include[0]"),
])
def test_bad_queries(user, query, param):
    rid = made(user)["id"]
    assert_error(user.get(f"/v1/responses/{rid}/input_items?{query}"), 400, "invalid_request", param)


def test_include_of_what_the_service_has_is_accepted(user):
    rid = made(user)["id"]
    assert user.get(f"/v1/responses/{rid}/input_items?include=message.output_text.logprobs").status_code == 200


def test_another_clients_or_an_unknown_response_is_not_found(user, other, anon, admin):
    rid = made(user)["id"]
    assert_error(other.get(f"/v1/responses/{rid}/input_items"), 404, "not_found")
    for bad in ("resp_nope", "task_x", "conv_x"):
        assert_error(user.get(f"/v1/responses/{bad}/input_items"), 404, "not_found")
    assert anon.get(f"/v1/responses/{rid}/input_items").status_code == 401
    assert admin.get(f"/v1/responses/{rid}/input_items").status_code == 200


def test_deleting_the_response_deletes_its_items(user):
    rid = made(user)["id"]
    assert user.delete(f"/v1/responses/{rid}").status_code == 200
    assert_error(user.get(f"/v1/responses/{rid}/input_items"), 404, "not_found")


def test_the_scope_is_responses_read(store, app, user):
    from api_helpers import Api, make_client

    writer = Api(app, make_client(store, ["responses:write"], "writer")[1])
    rid = made(user)["id"]
    assert_error(writer.get(f"/v1/responses/{rid}/input_items"), 403, "insufficient_scope")
