"""B.1: every error code with its status and body, and bad input never a 500."""
from __future__ import annotations

import json
import sqlite3

import falcon.testing
import pytest
from api_helpers import Api, assert_error, make_client

from lmsp import auth
from lmsp.api.idempotency import fingerprint
from lmsp.app import create_app
from lmsp.store import Store

BG = {"model": "tiny", "input": "hi", "background": True}


def _client_id(store, api):
    return store.client_by_token_hash(auth.hash_token(api.token))["id"]


def case_invalid_request(ctx):
    return ctx.user.post("/v1/responses", json={"model": "tiny", "input": "hi", "top_k": -1})


def case_invalid_json(ctx):
    return ctx.user.post("/v1/responses", body='{"model": "tiny",', headers={"Content-Type": "application/json"})


def case_context_length_exceeded(ctx):
    return ctx.user.post("/v1/responses", json={"model": "tiny", "input": "w " * 5000})


def case_unauthorized(ctx):
    return Api(ctx.app).get("/v1/tasks")


def case_insufficient_scope(ctx):
    _, token = make_client(ctx.store, ["models:read"])
    return Api(ctx.app, token).get("/v1/tasks")


def case_not_found(ctx):
    return ctx.user.get("/v1/responses/resp_01ABSENT")


def case_idempotency_key_in_use(ctx):
    cid = _client_id(ctx.store, ctx.user)
    body = {"model": "tiny", "input": "hi"}
    ctx.store.create_task(client_id=cid, model="tiny", request=body, on_restart="fail", background=False,
                          stream=False, idempotency=("busy", fingerprint(cid, "POST", "/v1/responses", body)))
    return ctx.user.post("/v1/responses", json=body, headers={"Idempotency-Key": "busy"})


def case_task_finished(ctx):
    ctx.scripted.auto = True
    rid = ctx.user.post("/v1/responses", json={"model": "tiny", "input": "hi"}).json["id"]
    return ctx.user.post(f"/v1/responses/{rid}/cancel")


def case_task_unfinished(ctx):
    rid = ctx.user.post("/v1/responses", json=BG).json["id"]
    return ctx.user.delete(f"/v1/responses/{rid}")


def case_model_in_use(ctx):
    ctx.user.post("/v1/responses", json=BG)
    return ctx.admin.delete("/v1/models/tiny")


def case_model_changed(ctx):
    ctx.store.set_model_state("tiny", "changed")
    return ctx.user.post("/v1/responses", json=BG)


def case_payload_too_large(ctx):
    return ctx.user.post("/v1/responses", json={"model": "tiny", "input": "x" * (ctx.config.max_body_bytes + 1)})


def case_unsupported_media_type(ctx):
    return ctx.user.post("/v1/responses", body="model=tiny", headers={"Content-Type": "text/plain"})


def case_idempotency_key_reused(ctx):
    ctx.user.post("/v1/responses", json=BG, headers={"Idempotency-Key": "k"})
    return ctx.user.post("/v1/responses", json={**BG, "input": "other"}, headers={"Idempotency-Key": "k"})


def case_rate_limited(ctx):
    for _ in range(ctx.config.pairing_max_attempts):
        Api(ctx.app).post("/v1/pair", json={"code": "WRONG", "client_name": "x"})
    return Api(ctx.app).post("/v1/pair", json={"code": "WRONG", "client_name": "x"})


def case_unavailable(ctx):
    ctx.scripted.ready = False
    return Api(ctx.app).get("/readyz")


CASES = [
    (case_invalid_request, 400, "invalid_request", {}),
    (case_invalid_json, 400, "invalid_json", {}),
    (case_context_length_exceeded, 400, "context_length_exceeded", {}),
    (case_unauthorized, 401, "unauthorized", {"WWW-Authenticate": "Bearer"}),
    (case_insufficient_scope, 403, "insufficient_scope", {}),
    (case_not_found, 404, "not_found", {}),
    (case_idempotency_key_in_use, 409, "idempotency_key_in_use", {}),
    (case_task_finished, 409, "task_finished", {}),
    (case_task_unfinished, 409, "task_unfinished", {}),
    (case_model_in_use, 409, "model_in_use", {}),
    (case_model_changed, 409, "model_changed", {}),
    (case_payload_too_large, 413, "payload_too_large", {}),
    (case_unsupported_media_type, 415, "unsupported_media_type", {}),
    (case_idempotency_key_reused, 422, "idempotency_key_reused", {}),
    (case_rate_limited, 429, "rate_limited", {"Retry-After": None}),
    (case_unavailable, 503, "unavailable", {"Retry-After": None}),
]


class Ctx:
    def __init__(self, **kw):
        self.__dict__.update(kw)


@pytest.mark.parametrize("case,status,code,headers", CASES, ids=[c[2] for c in CASES])
def test_error_table(app, store, config, scripted, user, admin, case, status, code, headers):
    scripted.auto = False
    ctx = Ctx(app=app, store=store, config=config, scripted=scripted, user=user, admin=admin)
    result = case(ctx)
    assert_error(result, status, code)
    assert result.headers["Content-Type"].startswith("application/json")
    for name, value in headers.items():
        assert name in result.headers
        if value is not None:
            assert result.headers[name] == value


@pytest.mark.parametrize("state,says", [("changed", "changed"), ("missing", "missing")])
def test_a_model_file_changed_or_missing_is_refused_alike(user, scripted, store, state, says):
    scripted.auto = False
    store.set_model_state("tiny", state)
    err = assert_error(user.post("/v1/responses", json=BG), 409, "model_changed", param="model")
    assert says in err["message"]
    assert store.list_tasks()["data"] == []


@pytest.mark.slow  # a real service, crash or wait: seconds each on 2 cores
def test_locked_store_is_503_with_retry_after(config, scripted, tmp_path):
    store = Store.open(config.db_path, durability="off", busy_timeout=0.05)
    _, token = make_client(store, ["responses:write", "responses:read"])
    api = Api(create_app(config, store, scripted), token)
    locker = sqlite3.connect(config.db_path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    try:
        result = api.post("/v1/responses", json=BG)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
        store.close()
    assert_error(result, 503, "unavailable")
    assert int(result.headers["Retry-After"]) >= 1


BAD_BODIES = [
    ("empty", b"", "application/json", 400, "invalid_json"),
    ("not json", b"{model: tiny}", "application/json", 400, "invalid_json"),
    ("array", b"[1, 2]", "application/json", 400, "invalid_json"),
    ("string", b'"hi"', "application/json", 400, "invalid_json"),
    ("NaN", b'{"model": "tiny", "input": "x", "temperature": NaN}', "application/json", 400, "invalid_json"),
    ("beyond a double", b'{"model": "tiny", "input": "x", "temperature": 1e400}', "application/json", 400,
     "invalid_json"),
    ("bad utf-8", b'{"model": "\xff"}', "application/json", 400, "invalid_json"),
    ("deep", b"[" * 20000 + b"]" * 20000, "application/json", 400, "invalid_json"),
    ("no content type", b'{"model": "tiny"}', None, 415, "unsupported_media_type"),
    ("form", b"a=b", "application/x-www-form-urlencoded", 415, "unsupported_media_type"),
    ("latin-1", b'{"model": "tiny"}', "application/json; charset=latin-1", 415, "unsupported_media_type"),
    ("gzip", b'{"model": "tiny"}', "application/json", 415, "unsupported_media_type"),
    ("huge", b'{"input": "' + b"x" * (1 << 20) + b'"}', "application/json", 413, "payload_too_large"),
    # a lone surrogate escape: a string that no UTF-8 text (database, log, answer) can hold
    ("surrogate in input", b'{"model": "tiny", "input": "a\\ud800b"}', "application/json", 400, "invalid_json"),
    ("surrogate in a field name", b'{"model": "tiny", "input": "x", "\\udc80": 1}', "application/json", 400,
     "invalid_json"),
    ("surrogate in metadata", b'{"model": "tiny", "input": "x", "metadata": {"k\\uDBFF": "v"}}',
     "application/json", 400, "invalid_json"),
    ("nested 33 deep", b'{"model": "tiny", "input": [{"role": "user", "content": [{"type": "text", "text": "x",'
     b' "annotations": ' + b"[" * 29 + b"]" * 29 + b"}]}]}", "application/json", 400, "invalid_json"),
    # a key twice in one object: which value counts is up to each parser
    ("duplicate key", b'{"model": "tiny", "input": "x", "model": "other"}', "application/json", 400,
     "invalid_json"),
    ("duplicate key in metadata", b'{"model": "tiny", "input": "x", "metadata": {"k": "a", "k": "b"}}',
     "application/json", 400, "invalid_json"),
    ("duplicate key in a part", b'{"model": "tiny", "input": [{"role": "user", "content": [{"type": "text",'
     b' "text": "a", "text": "b"}]}]}', "application/json", 400, "invalid_json"),
]


def test_an_integral_float_is_the_integer_and_a_fraction_is_refused_by_its_field(user):
    body = {"model": "tiny", "input": "x", "max_output_tokens": 5.0, "seed": 7.0, "temperature": 1}
    answer = user.post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.json
    assert answer.json["max_output_tokens"] == 5 and answer.json["seed"] == 7
    assert answer.json["temperature"] == 1.0
    assert_error(user.post("/v1/responses", json={**body, "max_output_tokens": 5.5}), 400, "invalid_request",
                 "max_output_tokens")


@pytest.mark.parametrize("name,body,ctype,status,code", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_bodies(user, store, name, body, ctype, status, code):
    headers = {"Content-Type": ctype} if ctype else {}
    if name == "gzip":
        headers["Content-Encoding"] = "gzip"
    result = user.post("/v1/responses", body=body, headers=headers)
    assert_error(result, status, code)
    assert store.list_tasks()["data"] == []


def test_a_duplicate_key_is_named(user):
    body = b'{"model": "tiny", "input": [{"role": "user", "content": "a", "role": "user"}]}'
    err = assert_error(user.post("/v1/responses", body=body, headers={"Content-Type": "application/json"}),
                       400, "invalid_json")
    assert "'role'" in err["message"] and "twice" in err["message"]


@pytest.mark.parametrize("digits", [5000, 50_000])
def test_an_integer_too_long_to_read_says_so(user, store, digits):
    body = b'{"model": "tiny", "input": "x", "seed": ' + b"7" * digits + b"}"
    err = assert_error(user.post("/v1/responses", body=body, headers={"Content-Type": "application/json"}),
                       400, "invalid_json")
    assert f"{digits} digits" in err["message"]
    assert "int_max_str_digits" not in err["message"] and "sys." not in err["message"]
    assert store.list_tasks()["data"] == []


def test_whole_characters_and_nesting_within_the_limit_are_accepted(user, config):
    body = (b'{"model": "tiny", "input": [{"role": "user", "content": [{"type": "text", '
            b'"text": "\\ud83d\\ude00 \\\\ud800", "annotations": '
            + b"[" * 27 + b"]" * 27 + b'}]}], "background": true}')
    result = user.post("/v1/responses", body=body, headers={"Content-Type": "application/json"})
    assert result.status_code == 202, result.text
    with sqlite3.connect(config.db_path) as conn:
        (stored,) = conn.execute("SELECT request FROM responses").fetchone()
    # a part's annotations play no part: the task keeps the role and the text
    assert json.loads(stored)["input"] == [{"role": "user", "content": "\U0001F600 \\ud800"}]


@pytest.mark.parametrize("field,value,param", [
    ("temperature", 10**400, "temperature"),
    ("top_p", -10**400, "top_p"),
    ("input", "a\0b", "input"),
    ("input", [{"role": "user", "content": [{"type": "text", "text": "a\0"}]}], "input[0].content"),
    ("instructions", "be\0", "instructions"),
])
def test_values_nothing_downstream_can_take_are_refused(user, store, field, value, param):
    result = user.post("/v1/responses", json={"model": "tiny", "input": "hi", field: value})
    assert_error(result, 400, "invalid_request", param=param)
    assert store.list_tasks()["data"] == []


def test_numbers_beyond_the_stores_integers_are_refused(user):
    rid = user.post("/v1/responses", json={"model": "tiny", "input": "hi", "background": True}).json["id"]
    tid = user.get(f"/v1/responses/{rid}").json["task"]["id"]
    big = str(2**63)
    assert_error(user.get(f"/v1/tasks/{tid}/events?after={big}"), 400, "invalid_request", param="after")
    assert_error(user.get(f"/v1/tasks/{tid}/events", headers={"Last-Event-ID": big}), 400, "invalid_request",
                 param="Last-Event-ID")
    stream = user.get(f"/v1/responses/{rid}?stream=true&starting_after={2**70}")
    assert_error(stream, 400, "invalid_request", param="starting_after")
    assert user.get(f"/v1/tasks/{tid}/events?after={2**63 - 1}").json["data"] == []
    # plain decimal digits only: no "1_0", "+3", " 3" or digits of other scripts
    for odd in ("1_0", "%2B3", "%203", "%D9%A3", "%EF%BC%93", "3.0"):
        assert_error(user.get(f"/v1/responses?limit={odd}"), 400, "invalid_request", param="limit")
    assert_error(user.get(f"/v1/tasks/{tid}/events", headers={"Last-Event-ID": "1_0"}), 400, "invalid_request",
                 param="Last-Event-ID")


def test_error_bodies_are_ascii_json(user):
    result = user.post("/v1/responses", json={"model": "tiny", "input": "hi", "caf\u00e9": 1})
    err = assert_error(result, 400, "invalid_request", param="caf\u00e9")
    assert result.content.isascii() and "caf\u00e9" in err["message"]


def test_json_with_charset_and_suffix_types_are_accepted(user):
    for ctype in ("application/json; charset=utf-8", "application/json;charset=UTF-8",
                  "application/vnd.lmsp+json"):
        result = user.post("/v1/responses", body=b'{"model": "tiny", "input": "hi"}',
                           headers={"Content-Type": ctype})
        assert result.status_code == 200, (ctype, result.text)


def test_declared_length_over_the_cap_is_refused_before_reading(user, config):
    result = user.post("/v1/responses", body=b"{}", headers={"Content-Type": "application/json",
                                                              "Content-Length": str(10 * config.max_body_bytes)})
    assert_error(result, 413, "payload_too_large")


@pytest.mark.parametrize("method,path,status,code", [
    ("GET", "/v1/nothing", 404, "not_found"),
    ("GET", "/", 404, "not_found"),
    ("PUT", "/v1/responses", 405, "method_not_allowed"),
    ("PATCH", "/v1/tasks/task_X", 405, "method_not_allowed"),
    ("GET", "/v1/responses/resp_X/cancel", 405, "method_not_allowed"),
    ("POST", "/v1/service", 405, "method_not_allowed"),
    ("GET", "/v1/responses/%00%01", 404, "not_found"),
    ("GET", "/v1/tasks/" + "x" * 5000, 404, "not_found"),
    ("GET", "/v1/responses/resp_\u00e9", 404, "not_found"),
])
def test_routing_errors_have_the_error_body(admin, method, path, status, code):
    assert_error(admin.request(method, path), status, code)


def test_unexpected_errors_are_a_generic_500(config, store, scripted, caplog):
    class Broken(type(scripted)):
        def list_models(self):
            raise RuntimeError("secret detail")

    _, token = make_client(store, ["models:read"])
    client = falcon.testing.TestClient(create_app(config, store, Broken(store)))
    with caplog.at_level("ERROR", logger="lmsp.api"):
        result = client.simulate_get("/v1/models", headers={"Authorization": f"Bearer {token}"})
    err = assert_error(result, 500, "internal_error")
    assert "secret" not in err["message"] and "Traceback" not in result.text
    assert any("secret detail" in (r.exc_text or "") or r.exc_info for r in caplog.records)


def test_405_names_the_allowed_methods(admin):
    result = admin.request("PUT", "/v1/responses")
    assert set(result.headers["Allow"].replace(" ", "").split(",")) >= {"GET", "POST"}


def test_trailing_slash_is_the_same_route(user):
    assert user.get("/v1/responses/").status_code == 200
