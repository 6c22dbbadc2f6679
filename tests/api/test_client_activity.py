"""A client's activity as the admin reads it (``GET /v1/clients``): when its token was last
used (``last_seen_at``, written at most once a minute however many requests come) and its
tokens today and over the last 24 hours, from its hours of usage."""
from __future__ import annotations

from api_helpers import Api, make_client

from lmsp.app import create_app
from lmsp.errors import Unavailable
from lmsp.store.sharing import record_usage

USER = ["responses:write", "responses:read", "models:read"]


def seen(admin: Api, client_id: str) -> int | None:
    return admin.get(f"/v1/clients/{client_id}").json["last_seen_at"]


def counting(store, monkeypatch) -> list[str]:
    """The writes of ``last_seen_at`` (calls of ``note_seen`` that write), as they come."""
    writes: list[str] = []
    real = store.note_seen

    def note_seen(client_id, every):
        wrote = real(client_id, every)
        if wrote:
            writes.append(client_id)
        return wrote

    monkeypatch.setattr(store, "note_seen", note_seen)
    return writes


def test_a_request_moves_last_seen_and_a_burst_writes_once(store, app, admin, clock, monkeypatch):
    client, token = make_client(store, USER, "app")
    api = Api(app, token)
    assert seen(admin, client["id"]) is None  # paired, never used
    writes = counting(store, monkeypatch)
    for _ in range(20):
        assert api.get("/v1/models").status_code == 200
    assert writes == [client["id"]]
    first = seen(admin, client["id"])
    assert first is not None and abs(first - clock()) <= 2
    clock.advance(30)  # within the minute: nothing written
    api.get("/v1/tasks")
    assert writes == [client["id"]] and seen(admin, client["id"]) == first
    clock.advance(31)  # a minute on: the next request moves it
    for _ in range(5):
        api.get("/v1/tasks")
    assert writes == [client["id"]] * 2
    assert seen(admin, client["id"]) >= first + 60


def test_a_refused_scope_still_counts_as_seen_and_a_bad_token_does_not(store, app, admin):
    client, token = make_client(store, ["models:read"], "reader")
    assert Api(app, token).get("/v1/clients").status_code == 403
    assert seen(admin, client["id"]) is not None
    other, _ = make_client(store, USER, "other")
    assert Api(app, "lmsp_not-a-token").get("/v1/models").status_code == 401
    assert seen(admin, other["id"]) is None


def test_another_worker_reads_the_time_written_and_does_not_write_again(store, config, scripted, clock,
                                                                        monkeypatch):
    _, token = make_client(store, USER, "app")
    workers = [create_app(config, store, scripted, clock=clock) for _ in range(2)]
    writes = counting(store, monkeypatch)
    for worker in workers * 3:
        assert Api(worker, token).get("/v1/models").status_code == 200
    assert len(writes) == 1


def test_a_busy_store_does_not_refuse_the_request(store, app, monkeypatch):
    _, token = make_client(store, USER, "app")

    def busy(client_id, every):
        raise Unavailable("the database is busy")

    monkeypatch.setattr(store, "note_seen", busy)
    assert Api(app, token).get("/v1/models").status_code == 200


def test_tokens_today_and_of_the_last_24_hours(store, admin, clock):
    client, _ = make_client(store, USER, "app")
    now = clock()
    midnight = now - now % 86400
    with store._db.write() as conn:  # usage rows as finished tasks leave them
        record_usage(conn, client["id"], now, 100)
        record_usage(conn, client["id"], midnight, 20)  # the first hour of today
        record_usage(conn, client["id"], midnight - 1, 7)  # the last hour of yesterday
        record_usage(conn, client["id"], now - 30 * 3600, 1000)  # past the 24 hours
    got = admin.get(f"/v1/clients/{client['id']}").json
    assert got["tokens_today"] == 120
    # the last 24 clock hours hold yesterday's last hour only when it is within them
    assert got["tokens_24h"] == 120 + (7 if now - midnight < 23 * 3600 else 0)
    listed = next(c for c in admin.get("/v1/clients").json["data"] if c["id"] == client["id"])
    assert (listed["tokens_today"], listed["tokens_24h"]) == (got["tokens_today"], got["tokens_24h"])
