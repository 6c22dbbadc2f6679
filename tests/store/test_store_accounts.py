"""Identity, settings, clients, pairing codes and models."""
from __future__ import annotations

import sqlite3

import pytest

from lmsp.errors import Conflict, InvalidRequest, ModelInUse, NotFound, RateLimited
from lmsp.objects import public_model
from lmsp.store import Store


def test_identity_is_created_once(db_path, clock):
    with_store = Store.open(db_path, clock=clock)
    first = with_store.identity()
    assert first["service_id"].startswith("svc_") and first["created_at"] == int(clock.now)
    with_store.close()
    clock.advance(100)
    again = Store.open(db_path, clock=clock)
    assert again.identity() == first
    again.close()


def test_close_is_idempotent_and_final(db_path):
    s = Store.open(db_path)
    s.close()
    s.close()
    with pytest.raises(RuntimeError):
        s.get_setting("x")


def test_settings(store):
    assert store.get_setting("missing", 5) == 5
    store.set_setting("retention_days", 3)
    store.set_setting("retention_days", {"v": [1, 2]})
    assert store.get_setting("retention_days") == {"v": [1, 2]}


def test_clients_store_hashes_only(store, clock):
    c = store.create_client(name="laptop", scopes=["responses:read"], token_hash="h1")
    assert c["id"].startswith("cli_") and c["scopes"] == ["responses:read"] and c["revoked_at"] is None
    assert "token_hash" not in c
    # the authentication's read, at every request: the client without its activity
    activity = ("last_task_at", "tokens_24h", "tokens_today")
    assert store.client_by_token_hash("h1") == {k: v for k, v in c.items() if k not in activity}
    assert store.client_by_token_hash("nope") is None
    with pytest.raises(Conflict):
        store.create_client(name="dup", scopes=[], token_hash="h1")
    with pytest.raises(InvalidRequest):
        store.create_client(name="", scopes=[], token_hash="h2")
    with pytest.raises(InvalidRequest):
        store.create_client(name="x", scopes="admin", token_hash="h2")
    revoked = store.revoke_client(c["id"])
    assert revoked["revoked_at"] == int(clock.now)
    assert store.client_by_token_hash("h1") is None
    assert [x["id"] for x in store.list_clients()] == [c["id"]]
    with pytest.raises(NotFound):
        store.revoke_client("cli_nope")


def test_pairing_codes_work_once_and_expire(store, clock):
    p = store.create_pairing(code_hash="c1", scopes=["responses:write"], expires_at=clock.now + 60, name="phone")
    assert p["scopes"] == ["responses:write"] and p["expires_at"] == int(clock.now + 60)
    client = store.redeem_pairing(code_hash="c1", client_name="phone", token_hash="t1")
    assert client["scopes"] == ["responses:write"] and store.client_by_token_hash("t1")["id"] == client["id"]
    with pytest.raises(NotFound):
        store.redeem_pairing(code_hash="c1", client_name="again", token_hash="t2")
    store.create_pairing(code_hash="c2", scopes=[], expires_at=clock.now + 60)
    clock.advance(61)
    with pytest.raises(NotFound):
        store.redeem_pairing(code_hash="c2", client_name="late", token_hash="t3")
    with pytest.raises(NotFound):
        store.redeem_pairing(code_hash="unknown", client_name="x", token_hash="t4")
    assert store.client_by_token_hash("t3") is None


def test_pairing_failures_are_counted(store, clock, db_path):
    """A failed redeem is recorded with its time; the limit counts those of its window."""
    for guess in ("wrong-1", "wrong-2"):
        with pytest.raises(NotFound):
            store.redeem_pairing(code_hash=guess, client_name="x", token_hash=guess)
        clock.advance(10)
    with sqlite3.connect(db_path) as conn:
        assert [at for (at,) in conn.execute("SELECT at FROM pairing_failures ORDER BY at")] == [
            clock.now - 20, clock.now - 10]
    with pytest.raises(RateLimited):  # both within 50 s: refused, not counted again
        store.redeem_pairing(code_hash="wrong-3", client_name="x", token_hash="t3", max_failures=2, window=50)
    with pytest.raises(NotFound):  # only the second within 15 s: tried
        store.redeem_pairing(code_hash="wrong-4", client_name="x", token_hash="t4", max_failures=2, window=15)
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT count(*) FROM pairing_failures").fetchone()[0] == 3


MODEL = {"id": "tiny", "path": "tiny.gguf", "digest": "sha256:" + "0" * 64, "size_bytes": 1234,
         "format": "gguf", "architecture": "llama", "parameters": 1000, "quantization": "f32",
         "context_length": 256, "state": "available"}


def test_models_hold_metadata_only(store, make_task):
    m = store.put_model(MODEL)
    assert m["object"] == "model" and m["owned_by"] == "local" and m["path"] == "tiny.gguf"
    assert "path" not in public_model(m)
    assert store.get_model("tiny") == m
    store.put_model({**MODEL, "digest": "sha256:" + "1" * 64})
    assert store.get_model("tiny")["digest"].endswith("1" * 64)
    assert store.get_model("tiny")["created"] == m["created"]
    store.set_model_state("tiny", "loaded")
    assert [x["state"] for x in store.list_models()] == ["loaded"]
    with pytest.raises(InvalidRequest):
        store.set_model_state("tiny", "exploded")
    with pytest.raises(InvalidRequest):
        store.put_model({"id": "x"})
    with pytest.raises(NotFound):
        store.set_model_state("nope", "loaded")
    with pytest.raises(NotFound):
        store.get_model("nope")
    task = make_task(model="tiny")
    with pytest.raises(ModelInUse):
        store.delete_model("tiny")
    store.cancel(task["task"]["id"])
    store.delete_model("tiny")
    with pytest.raises(NotFound):
        store.delete_model("tiny")


def test_concurrent_guesses_cannot_outrun_the_limit(store, clock):
    """The count, the code and the failure's record are one transaction: of many guesses
    at once, exactly the limit's worth are tried, the others are refused unread."""
    import threading

    from lmsp.errors import RateLimited

    store.create_pairing(code_hash="real", scopes=["responses:read"], expires_at=clock.now + 600)
    outcomes: list[str] = []
    lock = threading.Lock()

    def guess(i: int) -> None:
        try:
            store.redeem_pairing(code_hash=f"wrong-{i}", client_name="x", token_hash=f"t{i}",
                                 max_failures=5, window=60)
            result = "paired"
        except NotFound:
            result = "tried"
        except RateLimited:
            result = "limited"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("tried") == 5 and outcomes.count("limited") == 35
    with pytest.raises(RateLimited):  # the real code too, until the window passes
        store.redeem_pairing(code_hash="real", client_name="x", token_hash="r", max_failures=5, window=60)
    clock.advance(61)
    assert store.redeem_pairing(code_hash="real", client_name="x", token_hash="r", max_failures=5, window=60)
