"""A client's priority and limits, changed by an admin (``PATCH /v1/clients/{id}``),
and what the client then meets."""
from __future__ import annotations

import pytest
from api_helpers import Api, assert_error, make_client

USER = ["responses:write", "responses:read", "models:read"]
BACKGROUND = {"model": "tiny", "input": "hi", "background": True}


def test_a_new_client_has_no_limits(store, admin):
    client, _ = make_client(store, USER)
    got = admin.get(f"/v1/clients/{client['id']}").json
    assert (got["priority"], got["max_running"], got["max_queued"], got["tokens_per_hour"]) == (1, None, None, None)


def test_an_admin_sets_some_limits_and_keeps_the_others(store, admin):
    client, _ = make_client(store, USER)
    path = f"/v1/clients/{client['id']}"
    first = admin.patch(path, json={"priority": 3, "max_queued": 5, "tokens_per_hour": 10_000})
    assert first.status_code == 200, first.text
    assert first.json["object"] == "client" and first.json["id"] == client["id"]
    assert (first.json["priority"], first.json["max_queued"], first.json["tokens_per_hour"]) == (3, 5, 10_000)
    assert first.json["max_running"] is None
    second = admin.patch(path, json={"max_running": 2, "tokens_per_hour": None}).json
    assert (second["priority"], second["max_running"], second["max_queued"]) == (3, 2, 5)
    assert second["tokens_per_hour"] is None  # null takes the limit away
    assert admin.patch(path, json={}).json == second
    assert admin.get(path).json == second
    assert store.client_limits(client["id"]) == {"priority": 3, "max_running": 2, "max_queued": 5,
                                                 "tokens_per_hour": None}


@pytest.mark.parametrize("body,param", [
    ({"priority": 0}, "priority"), ({"priority": 101}, "priority"), ({"priority": None}, "priority"),
    ({"max_running": -1}, "max_running"), ({"max_queued": "3"}, "max_queued"),
    ({"tokens_per_hour": False}, "tokens_per_hour"), ({"scopes": ["admin"]}, "scopes"),
])
def test_a_bad_limit_is_refused_and_nothing_changes(store, admin, body, param):
    client, _ = make_client(store, USER)
    assert_error(admin.patch(f"/v1/clients/{client['id']}", json=body), 400, "invalid_request", param)
    assert store.client_limits(client["id"])["priority"] == 1


def test_an_unknown_client_is_not_found(admin):
    assert_error(admin.patch("/v1/clients/cli_NOPE", json={"priority": 2}), 404, "not_found")
    assert_error(admin.patch("/v1/clients/resp_1", json={"priority": 2}), 404, "not_found")


def test_only_an_admin_changes_limits(store, app, user):
    client, _ = make_client(store, USER)
    assert_error(user.patch(f"/v1/clients/{client['id']}", json={"priority": 100}), 403, "insufficient_scope")


def test_a_client_at_its_max_queued_is_told_to_wait_and_another_is_not(store, app, admin, scripted):
    limited, token = make_client(store, USER, "limited")
    api, other = Api(app, token), Api(app, make_client(store, USER, "other")[1])
    # nothing of it starts (max_running 0), so its tasks stay queued
    admin.patch(f"/v1/clients/{limited['id']}", json={"max_running": 0, "max_queued": 2})
    for _ in range(2):
        assert api.post("/v1/responses", json=BACKGROUND).status_code == 202
    refused = api.post("/v1/responses", json=BACKGROUND)
    assert_error(refused, 429, "rate_limited")
    assert int(refused.headers["Retry-After"]) >= 1
    assert len(api.get("/v1/responses").json["data"]) == 2  # nothing stored for the refused one
    assert other.post("/v1/responses", json=BACKGROUND).status_code == 202
    assert other.get("/v1/responses").json["data"][0]["status"] == "completed"


def test_metrics_show_each_clients_tasks_and_tokens_by_its_id(store, app, admin, anon, scripted):
    held, token = make_client(store, USER, "held back")
    free, free_token = make_client(store, USER, "a name\nof any kind")
    admin.patch(f"/v1/clients/{held['id']}", json={"max_running": 0})
    for _ in range(2):
        assert Api(app, token).post("/v1/responses", json=BACKGROUND).status_code == 202
    done = Api(app, free_token).post("/v1/responses", json={"model": "tiny", "input": "hi"}).json
    text = anon.get("/metrics").text
    assert f'lmsp_client_tasks{{client="{held["id"]}",state="queued"}} 2' in text
    assert f'lmsp_client_tasks{{client="{held["id"]}",state="running"}} 0' in text
    tokens = done["usage"]["input_tokens"] + done["usage"]["output_tokens"]
    assert tokens > 0
    assert f'lmsp_client_tokens_this_hour{{client="{free["id"]}"}} {tokens}' in text
    assert f'lmsp_client_tokens_this_hour{{client="{held["id"]}"}} 0' in text
    assert "held back" not in text and "a name" not in text  # never by name
