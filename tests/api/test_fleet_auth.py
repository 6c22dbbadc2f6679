"""A box of a fleet (box id ``a``, the fleet key, peer ``b``): its pairing codes name it, its
clients get fleet tokens (the same one again for a retried redemption), and it takes the
fleet tokens of box b's clients but for an admin's, a forged one or a revoked one."""
from __future__ import annotations

import pytest
from api_helpers import Api

from lmsp import ids
from lmsp.app import create_app
from lmsp.config import Config
from lmsp.fleet import keys
from lmsp.fleet.members import members_for

OTHER = "cli_b_" + "0" * 26


@pytest.fixture
def config(tmp_path) -> Config:
    keys.init(tmp_path)
    return Config(data_dir=tmp_path, box_id="a", peers="b=127.0.0.1:9", max_output_tokens=16,
                  max_output_tokens_cap=64, n_ctx=256, n_parallel=2).validated()


@pytest.fixture
def app(config, store, scripted, clock):
    ids.set_box("a")
    yield create_app(config, store, scripted, clock=clock, fleet=members_for(config, store))
    ids.set_box("")


def fleet_token(config, client_id=OTHER, scopes=("responses:read",), key=None) -> str:
    return keys.token(key or keys.load(config.data_dir), client_id, "elsewhere", list(scopes), "lmsp_local" + client_id)


def test_a_client_paired_here_gets_a_fleet_token_and_a_retry_the_same(admin, anon, app):
    made = admin.post("/v1/pairings", json={"scopes": ["responses:read"]})
    assert made.status_code == 201 and made.json["code"].startswith("a.")
    asked = {"json": {"code": made.json["code"], "client_name": "laptop"}, "headers": {"Idempotency-Key": "k1"}}
    first, again = anon.post("/v1/pair", **asked), anon.post("/v1/pair", **asked)
    assert first.status_code == again.status_code == 201
    assert first.json["token"].startswith("lmspf_") and again.json["token"] == first.json["token"]
    assert ids.owner(first.json["client_id"]) == "a"
    assert Api(app, first.json["token"]).get("/v1/responses").status_code == 200


def test_an_admin_token_stays_the_box_own(admin, anon):
    made = admin.post("/v1/pairings", json={"scopes": ["admin"]})
    got = anon.post("/v1/pair", json={"code": made.json["code"], "client_name": "ops"})
    assert got.status_code == 201 and not got.json["token"].startswith("lmspf_")


def test_a_client_of_another_box_is_taken_and_copied_until_revoked(app, config, store):
    token = fleet_token(config)
    assert Api(app, token).get("/v1/responses").status_code == 200
    assert Api(app, token).get("/v1/responses").status_code == 200  # the copy now
    assert OTHER in [row["id"] for row in store.list_clients()]
    assert Api(app, token).post("/v1/responses", json={"model": "tiny", "input": "x"}).status_code == 403
    store.revoke_copy(OTHER)
    assert Api(app, token).get("/v1/responses").status_code == 401


@pytest.mark.parametrize("case", ["admin", "forged", "unknown box", "own box"])
def test_fleet_tokens_refused(app, config, case):
    token = {
        "admin": lambda: fleet_token(config, scopes=("admin",)),
        "forged": lambda: fleet_token(config, key=b"x" * 32),
        "unknown box": lambda: fleet_token(config, client_id="cli_z_" + "0" * 26),
        "own box": lambda: fleet_token(config, client_id="cli_a_" + "0" * 26),
    }[case]()
    got = Api(app, token).get("/v1/responses")
    assert got.status_code == 401 and got.json["error"]["code"] == "unauthorized"


def test_the_revoked_list_is_for_the_fleet_only(app, config, store, admin):
    anon = Api(app)
    assert anon.get("/v1/fleet/revoked").status_code == 401
    key = keys.load(config.data_dir)
    mine = admin.post("/v1/pairings", json={"scopes": ["responses:read"]})
    client = anon.post("/v1/pair", json={"code": mine.json["code"], "client_name": "c"}).json
    store.revoke_client(client["client_id"])
    got = anon.get("/v1/fleet/revoked", headers={"Authorization": keys.peer_header(key)})
    assert got.status_code == 200 and got.json["revoked"] == [client["client_id"]]
