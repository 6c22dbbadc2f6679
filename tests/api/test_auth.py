"""B.2: tokens, scopes, pairing, clients."""
from __future__ import annotations

import pytest
from api_helpers import Api, assert_error, make_client

from lmsp import auth
from lmsp.errors import Unavailable

# every authenticated route with the scope it needs (ids need not exist: the
# scope is checked before anything is looked up)
SCOPED_ROUTES = [
    ("GET", "/v1/clients", "admin"),
    ("GET", "/v1/clients/cli_X", "admin"),
    ("PATCH", "/v1/clients/cli_X", "admin"),
    ("DELETE", "/v1/clients/cli_X", "admin"),
    ("POST", "/v1/pairings", "admin"),
    ("GET", "/v1/models", "models:read"),
    ("GET", "/v1/models/tiny", "models:read"),
    ("POST", "/v1/models", "models:write"),
    ("DELETE", "/v1/models/tiny", "models:write"),
    ("POST", "/v1/models/tiny/load", "models:write"),
    ("POST", "/v1/models/tiny/unload", "models:write"),
    ("POST", "/v1/responses", "responses:write"),
    ("GET", "/v1/responses", "responses:read"),
    ("GET", "/v1/responses/resp_X", "responses:read"),
    ("DELETE", "/v1/responses/resp_X", "responses:write"),
    ("POST", "/v1/responses/resp_X/cancel", "responses:write"),
    ("GET", "/v1/tasks", "responses:read"),
    ("GET", "/v1/tasks/task_X", "responses:read"),
    ("POST", "/v1/tasks/task_X/cancel", "responses:write"),
    ("GET", "/v1/tasks/task_X/events", "responses:read"),
]


def test_helpers():
    token = auth.new_token()
    assert len(token) >= 43 and token != auth.new_token()
    assert auth.hash_token(token) == auth.hash_token(token) and len(auth.hash_token(token)) == 64
    code = auth.new_pairing_code()
    assert auth.hash_code(code) == auth.hash_code(code.lower().replace("-", " "))
    assert auth.expand_scopes(["admin"]) == set(auth.SCOPES)
    assert auth.expand_scopes(["models:read"]) == {"models:read"}
    assert auth.constant_time_equal("abc", "abc") and not auth.constant_time_equal("abc", "abd")


@pytest.mark.parametrize("method,path,scope", SCOPED_ROUTES)
def test_each_route_needs_its_scope(store, app, method, path, scope):
    others = [s for s in auth.SCOPES if s not in (scope, "admin")]
    _, token = make_client(store, others)
    result = Api(app, token).request(method, path, json={})
    assert_error(result, 403, "insufficient_scope")
    no_token = Api(app).request(method, path, json={})
    err = assert_error(no_token, 401, "unauthorized")
    assert no_token.headers["WWW-Authenticate"] == "Bearer"
    assert "Authorization" in err["message"]


@pytest.mark.parametrize("method,path,scope", SCOPED_ROUTES)
def test_admin_implies_every_scope(admin, method, path, scope):
    result = admin.request(method, path, json={})
    assert result.status_code not in (401, 403), result.text


@pytest.mark.parametrize("header", [
    "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Token abc", "Bearer unknown-token",
    "Bearer " + "x" * 600, "bearer\tx", "Bearer tok\u00e9n",
])
def test_bad_tokens_are_401(app, header):
    result = Api(app).get("/v1/responses", headers={"Authorization": header})
    assert_error(result, 401, "unauthorized")
    assert result.headers["WWW-Authenticate"] == "Bearer"


def test_scheme_is_case_insensitive(store, app):
    _, token = make_client(store, ["responses:read"])
    result = Api(app).get("/v1/responses", headers={"Authorization": f"bearer {token}"})
    assert result.status_code == 200


def test_public_routes(anon):
    assert anon.get("/v1/service").status_code == 200
    assert anon.get("/healthz").status_code == 200
    assert anon.get("/metrics").status_code == 200
    assert anon.get("/openapi.json").status_code == 200


def test_pairing_flow(admin, anon, app):
    made = admin.post("/v1/pairings", json={"scopes": ["responses:read", "responses:write"],
                                            "name": "laptop"})
    assert made.status_code == 201, made.text
    code = made.json["code"]
    assert made.json["scopes"] == ["responses:read", "responses:write"]
    assert made.json["expires_at"] > made.json["created_at"]
    paired = anon.post("/v1/pair", json={"code": code, "client_name": "my laptop"})
    assert paired.status_code == 201, paired.text
    body = paired.json
    assert body["client_id"].startswith("cli_") and body["scopes"] == ["responses:read", "responses:write"]
    new = Api(app, body["token"])
    assert new.get("/v1/responses").status_code == 200
    assert_error(new.get("/v1/models"), 403, "insufficient_scope")
    # a code works once
    again = anon.post("/v1/pair", json={"code": code, "client_name": "thief"})
    assert_error(again, 400, "invalid_request", param="code")
    # the admin sees the client; revoking it stops the token at once
    listed = admin.get("/v1/clients").json["data"]
    assert body["client_id"] in [c["id"] for c in listed]
    assert all("token_hash" not in c for c in listed)
    assert admin.get(f"/v1/clients/{body['client_id']}").json["name"] == "my laptop"
    revoked = admin.delete(f"/v1/clients/{body['client_id']}")
    assert revoked.status_code == 200 and revoked.json["revoked_at"] is not None
    assert_error(new.get("/v1/responses"), 401, "unauthorized")


def test_pairing_requests_are_idempotent_without_storing_their_secrets(admin, anon, app, store, config, clock):
    """B.8 on both pairing routes: a retry with the key gets the same code, the same token,
    and makes nothing new; another request under the key is 422. The store holds neither
    the code nor the token (B.2): they are derived from the key and the service's secret."""
    headers = {"Idempotency-Key": "pair-1"}
    made = admin.post("/v1/pairings", json={"name": "desk"}, headers=headers)
    again = admin.post("/v1/pairings", json={"name": "desk"}, headers=headers)
    assert made.status_code == again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true" and again.json == made.json
    assert_error(admin.post("/v1/pairings", json={"name": "other"}, headers=headers), 422, "idempotency_key_reused")
    code = made.json["code"]
    other = admin.post("/v1/pairings", json={"name": "desk"}, headers={"Idempotency-Key": "pair-2"}).json["code"]
    assert other != code

    body = {"code": code, "client_name": "desk"}
    paired = anon.post("/v1/pair", json=body, headers={"Idempotency-Key": "redeem-1"})
    replay = anon.post("/v1/pair", json=body, headers={"Idempotency-Key": "redeem-1"})
    assert paired.status_code == replay.status_code == 201
    assert replay.headers["Idempotent-Replayed"] == "true" and replay.json == paired.json
    assert Api(app, replay.json["token"]).get("/v1/responses").status_code == 200
    assert [c["name"] for c in admin.get("/v1/clients").json["data"]].count("desk") == 1  # one client
    # the code is spent: under another key, or none, it is refused as before
    assert_error(anon.post("/v1/pair", json=body, headers={"Idempotency-Key": "redeem-2"}), 400,
                 "invalid_request", param="code")
    assert_error(anon.post("/v1/pair", json=body), 400, "invalid_request", param="code")
    # nothing secret in the database
    import sqlite3
    with sqlite3.connect(config.db_path) as conn:
        rows = "\n".join(str(row) for table in ("idempotency_keys", "pairings", "clients")
                         for row in conn.execute(f"SELECT * FROM {table}"))
    assert code not in rows and auth.normalize_code(code) not in rows and paired.json["token"] not in rows
    secret = config.data_dir / auth.SECRET_NAME
    assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_bytes()) == 32
    # a key answers a retry for as long as a code lives, not a day
    clock.advance(config.pairing_ttl_seconds + 1)
    late = anon.post("/v1/pair", json=body, headers={"Idempotency-Key": "redeem-1"})
    assert_error(late, 400, "invalid_request", param="code")


def test_a_pairing_key_used_again_after_it_expired_makes_a_new_code(admin, anon, clock, config, store):
    """The derivation takes a nonce of each request: an expired key, used again, is a new request."""
    headers = {"Idempotency-Key": "weekly"}
    first = admin.post("/v1/pairings", json={"name": "a"}, headers=headers).json["code"]
    clock.advance(config.pairing_ttl_seconds + 1)
    store.gc(retention=0)  # the spent code and the key go
    second = admin.post("/v1/pairings", json={"name": "a"}, headers=headers)
    assert second.status_code == 201 and "Idempotent-Replayed" not in second.headers
    assert second.json["code"] != first
    body = {"code": second.json["code"], "client_name": "a"}
    token = anon.post("/v1/pair", json=body, headers=headers).json["token"]
    clock.advance(config.pairing_ttl_seconds + 1)
    store.gc(retention=0)
    third = admin.post("/v1/pairings", json={"name": "a"}, headers=headers).json["code"]
    again = anon.post("/v1/pair", json={"code": third, "client_name": "a"}, headers=headers)
    assert again.status_code == 201 and again.json["token"] != token


def test_a_retry_of_a_redemption_with_another_name_is_a_failed_attempt(admin, anon, config):
    code = admin.post("/v1/pairings").json["code"]
    headers = {"Idempotency-Key": "r"}
    assert anon.post("/v1/pair", json={"code": code, "client_name": "real"}, headers=headers).status_code == 201
    for _ in range(config.pairing_max_attempts):  # guesses of the name under the key: never a 422
        guess = anon.post("/v1/pair", json={"code": code, "client_name": "guess"}, headers=headers)
        assert_error(guess, 400, "invalid_request", param="code")
    limited = anon.post("/v1/pair", json={"code": code, "client_name": "real"}, headers={"Idempotency-Key": "x"})
    assert_error(limited, 429, "rate_limited")


def test_an_unusable_service_key_is_a_503_for_keyed_pairing_only(admin, anon, config):
    (config.data_dir / auth.SECRET_NAME).write_bytes(b"short")
    auth._secrets.clear()
    keyed = admin.post("/v1/pairings", headers={"Idempotency-Key": "k"})
    assert_error(keyed, 503, "unavailable")
    assert "Idempotency-Key" in keyed.json["error"]["message"]
    code = admin.post("/v1/pairings").json["code"]  # without a key: as ever
    assert_error(anon.post("/v1/pair", json={"code": code, "client_name": "x"}, headers={"Idempotency-Key": "k"}),
                 503, "unavailable")
    assert anon.post("/v1/pair", json={"code": code, "client_name": "x"}).status_code == 201


def test_pairing_defaults_and_validation(admin):
    made = admin.post("/v1/pairings")
    assert made.status_code == 201
    assert made.json["scopes"] == ["responses:write", "responses:read", "models:read"]
    assert_error(admin.post("/v1/pairings", json={"scopes": ["root"]}), 400, "invalid_request", "scopes[0]")
    assert_error(admin.post("/v1/pairings", json={"scopes": []}), 400, "invalid_request", "scopes")
    assert_error(admin.post("/v1/pairings", json={"expires_in": 0}), 400, "invalid_request",
                 "expires_in")
    assert_error(admin.post("/v1/pairings", json={"color": "red"}), 400, "invalid_request", "color")


def test_pairing_code_expires(admin, anon, clock):
    code = admin.post("/v1/pairings", json={"expires_in": 60}).json["code"]
    clock.advance(61)
    result = anon.post("/v1/pair", json={"code": code, "client_name": "late"})
    assert_error(result, 400, "invalid_request", param="code")


def test_failed_pairing_attempts_are_limited(admin, anon, clock, config):
    code = admin.post("/v1/pairings").json["code"]
    for _ in range(config.pairing_max_attempts):
        bad = anon.post("/v1/pair", json={"code": "AAAA-BBBB-CCCC", "client_name": "guess"})
        assert_error(bad, 400, "invalid_request", param="code")
    limited = anon.post("/v1/pair", json={"code": code, "client_name": "real"})
    assert_error(limited, 429, "rate_limited")
    assert int(limited.headers["Retry-After"]) > 0
    clock.advance(61)  # the window passed: the real code still works
    assert anon.post("/v1/pair", json={"code": code, "client_name": "real"}).status_code == 201


def test_pair_validation(anon):
    assert_error(anon.post("/v1/pair", json={"client_name": "x"}), 400, "invalid_request", "code")
    assert_error(anon.post("/v1/pair", json={"code": "ABCD"}), 400, "invalid_request", "client_name")
    assert_error(anon.post("/v1/pair", json={"code": 5, "client_name": "x"}), 400, "invalid_request",
                 "code")
    assert_error(anon.post("/v1/pair", json={"code": "A", "client_name": "x", "admin": True}), 400,
                 "invalid_request", "admin")


def test_names_shown_to_the_operator_take_no_control_characters(admin, anon):
    assert_error(admin.post("/v1/pairings", json={"name": "lab\x1b[2J"}), 400, "invalid_request", "name")
    code = admin.post("/v1/pairings").json["code"]
    result = anon.post("/v1/pair", json={"code": code, "client_name": "laptop\x07\x1b]0;owned\x07"})
    assert_error(result, 400, "invalid_request", "client_name")
    assert anon.post("/v1/pair", json={"code": code, "client_name": "Lämpchen 日本"}).status_code == 201


def test_unknown_client_is_404(admin):
    assert_error(admin.delete("/v1/clients/cli_NOPE"), 404, "not_found")
    assert_error(admin.get("/v1/clients/nope"), 404, "not_found")


def test_a_revoked_clients_open_stream_ends(app, store, scripted, admin, monkeypatch):
    """Revocation takes effect on the next request, and on the streams already open."""
    import lmsp.service.streams as events
    from api_helpers import parse_sse

    monkeypatch.setattr(events, "AUTH_RECHECK_SECONDS", 0.0)
    client, token = make_client(store, ["responses:write", "responses:read"], "soon-revoked")
    cid = client["id"]
    api = Api(app, token)
    scripted.auto = False  # the task waits: the stream stays open until something ends it
    rid = api.post("/v1/responses", json={"model": "tiny", "input": "hi", "background": True}).json["id"]
    waits = []
    real_wait = scripted.wait_for_commit

    def wait_for_commit(task_id, after_seq, timeout, *args, **kwargs):
        waits.append(task_id)
        if len(waits) == 1:
            store.revoke_client(cid)  # while the stream waits
        return real_wait(task_id, after_seq, min(timeout, 0.05))

    scripted.wait_for_commit = wait_for_commit
    # a busy store at a check does not end the stream: the next check decides
    real_active, checks = store.client_active, []

    def client_active(client_id):
        checks.append(client_id)
        if len(checks) == 1:
            raise Unavailable("the store is busy")
        return real_active(client_id)

    monkeypatch.setattr(store, "client_active", client_active)
    result = api.get(f"/v1/responses/{rid}", params={"stream": "true"})
    frames = parse_sse(result.text)
    assert frames[-1]["event"] == "error" and frames[-1]["data"]["code"] == "unauthorized"
    assert len(checks) >= 2
    # the task is not cancelled: its stored answer stays for an admin
    assert store.get_task(store.task_id_for_response(rid, None))["status"] == "queued"


def _read_secret(folder: str) -> bytes:
    return auth.service_secret(folder)


def test_the_service_secret_is_made_once_whoever_asks_first(tmp_path):
    import multiprocessing
    folder = tmp_path / "data"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        made = pool.map(_read_secret, [str(folder)] * 8)
    assert len(set(made)) == 1 and len(made[0]) == 32
    assert auth.service_secret(folder) == made[0]
    assert sorted(p.name for p in folder.iterdir()) == [auth.SECRET_NAME]  # no temporary file left
