"""GET /v1/service/history: the service's own history by minute, for the console's plots."""
from __future__ import annotations

import pytest
from api_helpers import Api, assert_error, make_client


def figures(**kw):
    out = {"tokens": 0, "tasks_finished": 0, "errors": 0, "ttft": None, "running": 0, "db_bytes": None,
           "kv_bytes": None}
    out.update(kw)
    return out


def test_the_minutes_oldest_first_with_the_workers_summed(user, store, clock):
    minute = int(clock() // 60) - 3
    ttft = [[100.0, 3], [1000.0, 1], [None, 0]]
    store.record_minute("w1", minute, figures(tokens=600, errors=1, running=2, ttft=ttft, db_bytes=8192, kv_bytes=0))
    store.record_minute("w2", minute, figures(tokens=300, running=1, db_bytes=4096))
    store.record_minute("w1", minute + 2, figures(tokens=60))
    store.record_minute("w1", minute - 120, figures(tokens=1))  # before the hour asked for
    body = user.get("/v1/service/history?minutes=60").json
    assert body["object"] == "list" and body["interval_seconds"] == 60
    first, second = body["data"]
    assert first == {
        "at": minute * 60,
        "tokens_per_second": 15.0,
        "queued": 0,
        "running": 3,
        "ttft_p50_ms": 66.667,  # the 2nd of 4 samples, in the bucket 0 to 100 ms holding 3
        "ttft_p99_ms": 964.0,
        "errors": 1,
        "db_bytes": 8192,
        "kv_bytes": 0,
        "model_bytes": first["model_bytes"],
    }
    assert isinstance(first["model_bytes"], int)
    assert second["at"] == (minute + 2) * 60 and second["tokens_per_second"] == 1.0
    assert second["ttft_p50_ms"] is None and second["ttft_p99_ms"] is None
    assert second["db_bytes"] is None
    assert len(user.get("/v1/service/history?minutes=1440").json["data"]) == 3
    assert user.get("/v1/service/history").json == body  # an hour unless asked


def test_nothing_recorded_is_an_empty_list(user):
    assert user.get("/v1/service/history").json == {"object": "list", "interval_seconds": 60, "data": []}


@pytest.mark.parametrize("minutes", ["0", "1441", "-5", "ten", "1.5"])
def test_minutes_out_of_range_is_refused_naming_it(user, minutes):
    assert_error(user.get(f"/v1/service/history?minutes={minutes}"), 400, "invalid_request", "minutes")


def test_it_needs_models_read(store, app, anon, admin):
    writer = Api(app, make_client(store, ["responses:write", "responses:read"], "writer")[1])
    assert_error(writer.get("/v1/service/history"), 403, "insufficient_scope")
    assert_error(anon.get("/v1/service/history"), 401, "unauthorized")
    reader = Api(app, make_client(store, ["models:read"], "reader")[1])
    assert reader.get("/v1/service/history").status_code == 200
    assert admin.get("/v1/service/history").status_code == 200
