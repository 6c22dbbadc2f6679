"""The stored chat completions' metadata (B.11), as OpenAI's API has it: an update
(``POST /v1/chat/completions/{id}``) replaces it, and ``metadata[key]=value``
filters the list."""
from __future__ import annotations

import pytest
from api_helpers import assert_error


def chat(api, headers=None, **fields):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Say hello"}], "store": True}
    body.update(fields)
    return api.post("/v1/chat/completions", json=body, headers=headers)


def listed(api, **params) -> list[str]:
    result = api.get("/v1/chat/completions", params=params)
    assert result.status_code == 200, result.text
    return [c["id"] for c in result.json["data"]]


def test_an_update_replaces_the_metadata(user):
    made = chat(user, metadata={"a": "1", "b": "2"}).json
    updated = user.post(f"/v1/chat/completions/{made['id']}", json={"metadata": {"c": "3"}})
    assert updated.status_code == 200, updated.text
    assert updated.json["metadata"] == {"c": "3"} and updated.json["choices"] == made["choices"]
    assert updated.json["object"] == "chat.completion" and updated.json["id"] == made["id"]
    assert user.get(f"/v1/chat/completions/{made['id']}").json["metadata"] == {"c": "3"}
    cleared = user.post(f"/v1/chat/completions/{made['id']}", json={"metadata": None}).json
    assert cleared["metadata"] == {}


def test_an_update_keeps_the_rest_of_the_request(user):
    made = chat(user, logprobs=True).json
    updated = user.post(f"/v1/chat/completions/{made['id']}", json={"metadata": {"k": "v"}}).json
    assert updated["choices"][0]["logprobs"] == made["choices"][0]["logprobs"] is not None
    messages = user.get(f"/v1/chat/completions/{made['id']}/messages").json["data"]
    assert [m["content"] for m in messages] == ["Say hello"]


def test_an_update_with_its_key_is_answered_again(user):
    made = chat(user).json
    headers = {"Idempotency-Key": "update-1"}
    first = user.post(f"/v1/chat/completions/{made['id']}", json={"metadata": {"k": "v"}}, headers=headers)
    again = user.post(f"/v1/chat/completions/{made['id']}", json={"metadata": {"k": "v"}}, headers=headers)
    assert again.headers.get("Idempotent-Replayed") == "true" and again.json == first.json


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "metadata"),
        ({"metadata": {"k": 1}}, "metadata.k"),
        ({"metadata": "k"}, "metadata"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {}, "model": "tiny"}, "model"),
    ],
)
def test_bad_updates_are_400(user, body, param):
    made = chat(user).json
    assert_error(user.post(f"/v1/chat/completions/{made['id']}", json=body), 400, "invalid_request", param=param)


def test_only_the_owner_updates(user, other):
    made = chat(user).json
    assert_error(other.post(f"/v1/chat/completions/{made['id']}", json={"metadata": {}}), 404, "not_found")
    assert_error(user.post("/v1/chat/completions/chatcmpl-nope", json={"metadata": {}}), 404, "not_found")
    assert_error(user.post("/v1/chat/completions/resp_x", json={"metadata": {}}), 404, "not_found")


def test_the_list_filters_on_metadata(user):
    red = chat(user, metadata={"color": "red", "size": "s"}).json["id"]
    blue = chat(user, metadata={"color": "blue", "size": "s"}).json["id"]
    plain = chat(user).json["id"]
    assert listed(user) == [red, blue, plain]
    assert listed(user, **{"metadata[color]": "red"}) == [red]
    assert listed(user, **{"metadata[size]": "s"}) == [red, blue]
    assert listed(user, **{"metadata[size]": "s", "metadata[color]": "blue"}) == [blue]
    assert listed(user, **{"metadata[color]": "green"}) == []
    user.post(f"/v1/chat/completions/{plain}", json={"metadata": {"color": "red"}})
    assert listed(user, **{"metadata[color]": "red"}) == [red, plain]


@pytest.mark.parametrize("name", ["metadata", "metadata[]", "metadataX"])
def test_a_bad_metadata_filter_is_400(user, name):
    assert_error(user.get("/v1/chat/completions", params={name: "v"}), 400, "invalid_request", param=name)
