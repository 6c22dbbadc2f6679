"""Three boxes behind nginx, on loopback: the configuration ``lmsp fleet nginx`` prints, run
as it is; clients paired once on one box; every id answered by the box that holds it;
lists gathered; a revoke on one box refused by all; a box killed and brought back."""
from __future__ import annotations

import time

import openai
import pytest

from rel_checker import StoreView, check_acknowledged, check_recovery, copy_db, open_copy, open_live
from fleet_harness import BOXES, Fleet, owner

SMALL = {"model": "demo", "max_output_tokens": 4}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    made = Fleet(tmp_path_factory.mktemp("fleet"))
    try:
        try:
            made.start()
        except RuntimeError as exc:
            pytest.fail(str(exc))
        yield made
    finally:
        made.stop()


@pytest.fixture(scope="module")
def clients(fleet):
    """Two clients, each paired once through nginx (codes of box a and of box b)."""
    return [fleet.pair(box, f"on-{box}") for box in ("a", "b")]


@pytest.fixture(scope="module")
def made(fleet, clients):
    """60 background responses and 20 conversations of three turns, made through nginx."""
    responses = []
    for n in range(60):
        got = clients[n % 2].post("/v1/responses", {**SMALL, "input": f"n{n}", "background": True})
        assert got.status == 202, got.body
        responses.append((clients[n % 2], got.body))
    conversations = []
    for n in range(20):
        client = clients[n % 2]
        conv = client.post("/v1/conversations", {"metadata": {"n": str(n)}})
        assert conv.status == 200, conv.body
        turns = []
        for turn in range(3):
            body = {**SMALL, "input": f"turn {turn}", "conversation": conv.body["id"]}
            got = client.post("/v1/responses", body)
            assert got.status == 200, got.body
            turns.append(got.body["id"])
        conversations.append((client, conv.body["id"], turns))
    return responses, conversations



def every_page(client, path: str) -> list[str]:
    """The ids of a list through nginx, page after page by its cursor."""
    listed, after = [], None
    while True:
        got = client.get(path + (f"&after={after}" if after else ""))
        assert got.status == 200, got.body
        listed += [row["id"] for row in got.body["data"]]
        if not got.body["has_more"]:
            return listed
        after = got.body["last_id"]

def test_creates_spread_and_every_id_is_answered_by_its_box(fleet, clients, made):
    responses, conversations = made
    assert {owner(body["id"]) for _, body in responses} == set(BOXES)  # least_conn spread them
    for client, body in responses:
        rid, box = body["id"], owner(body["id"])
        assert owner(body["task"]["id"]) == box
        got = client.get(f"/v1/responses/{rid}")
        assert got.status == 200 and got.body["id"] == rid
        assert fleet.direct(client, box).get(f"/v1/responses/{rid}").status == 200
        other = next(b for b in BOXES if b != box)
        assert fleet.direct(client, other).get(f"/v1/responses/{rid}").status == 404  # only its box holds it
        assert client.get(f"/v1/responses/{rid}/input_items").status == 200
        assert client.get(f"/v1/tasks/{body['task']['id']}").status == 200
    for client, conv, turns in conversations:
        assert {owner(rid) for rid in turns} == {owner(conv)}  # every turn on the conversation's box
        items = client.get(f"/v1/conversations/{conv}/items?limit=100")
        assert items.status == 200 and len(items.body["data"]) >= 6


def test_stream_resume_and_cancel_reach_the_owner(fleet, clients, made):
    responses, _ = made
    client, body = responses[0]
    with client.stream("GET", f"/v1/responses/{body['id']}?stream=true&starting_after=0") as (status, _, events):
        assert status == 200
        seen = [event.event for event in events]
    assert seen[0] == "response.created" and seen[-1] in ("response.completed", "response.incomplete")
    for client, body in responses[-6:]:
        got = client.post(f"/v1/responses/{body['id']}/cancel")
        assert got.status in (200, 409), got.body  # cancelled, or finished already
        assert got.status == 409 or got.body["id"] == body["id"]


def test_a_retried_create_under_one_key_is_one_response(fleet, clients):
    asked = {**SMALL, "input": "once", "background": True}
    made = [clients[0].post("/v1/responses", asked, headers={"Idempotency-Key": "fleet-once"}) for _ in range(3)]
    assert {got.status for got in made} == {202}
    assert len({got.body["id"] for got in made}) == 1  # the key's box answered every retry


def test_a_turn_naming_an_earlier_response_goes_to_its_box(fleet, clients):
    client = clients[0]
    first = client.post("/v1/responses", {**SMALL, "input": "one"})
    chain = [first.body["id"]]
    for n in range(3):
        got = client.post("/v1/responses", {**SMALL, "input": f"next {n}", "previous_response_id": chain[-1]})
        assert got.status == 200, got.body
        chain.append(got.body["id"])
    assert len({owner(rid) for rid in chain}) == 1


def test_lists_through_nginx_are_the_union_of_the_boxes_lists(fleet, clients, made):
    for client in clients:
        union = set()
        for box in BOXES:
            got = fleet.direct(client, box).get("/v1/responses?limit=100")
            assert got.status == 200 and not got.body["has_more"]
            union |= {row["id"] for row in got.body["data"]}
        listed = every_page(client, "/v1/responses?limit=7")
        assert sorted(listed) == sorted(union) and len(listed) == len(union)
        created = [client.get(f"/v1/responses/{rid}").body["created_at"] for rid in listed]
        assert created == sorted(created, reverse=True)  # newest first


def test_stored_chat_completions_are_listed_from_every_box(fleet, clients):
    client = clients[1]
    made = []
    for n in range(6):
        got = client.post("/v1/chat/completions", {"model": "demo", "max_tokens": 2, "store": True,
                                                   "messages": [{"role": "user", "content": f"q{n}"}]})
        assert got.status == 200, got.body
        made.append(got.body["id"])
    listed = every_page(client, "/v1/chat/completions?limit=4")
    assert [rid for rid in listed if rid in made] == made  # oldest first, across the boxes
    assert len({owner(rid) for rid in made}) > 1


def test_a_revoke_on_one_box_is_refused_by_every_box(fleet, clients, made):
    responses, _ = made
    on_box = {owner(body["id"]): body["id"] for _, body in responses}  # an id held by each box
    victim = fleet.pair("b", "victim")
    for rid in on_box.values():
        assert victim.get(f"/v1/responses/{rid}").status == 404  # taken by every box; not its response
    listed = fleet.servers["b"].cli("clients", "list", "--json", "--data-dir", str(fleet.servers["b"].data_dir))
    assert victim.client_id in listed.stdout
    done = fleet.servers["b"].cli("clients", "revoke", victim.client_id, "--data-dir",
                                  str(fleet.servers["b"].data_dir))
    assert done.returncode == 0, done.stderr
    refused: set[str] = set()
    deadline = time.monotonic() + 5
    while refused != set(on_box) and time.monotonic() < deadline:
        for box, rid in on_box.items():
            if box not in refused and victim.get(f"/v1/responses/{rid}").status == 401:
                refused.add(box)
        time.sleep(0.1)
    assert refused == set(on_box)
    assert clients[0].get(f"/v1/responses/{on_box['b']}").status in (200, 404)  # the others go on


def test_openai_sdk_through_nginx(fleet, clients):
    with openai.OpenAI(base_url=f"http://127.0.0.1:{fleet.port}/v1", api_key=clients[1].token,
                       max_retries=0, timeout=60) as sdk:
        plain = sdk.responses.create(model="demo", input="Hello", max_output_tokens=4)
        assert plain.status in ("completed", "incomplete")
        streamed = [event.type for event in sdk.responses.create(model="demo", input="Hi", max_output_tokens=4,
                                                                  stream=True)]
        assert streamed[0] == "response.created" and streamed[-1] in ("response.completed", "response.incomplete")
        background = sdk.responses.create(model="demo", input="Later", max_output_tokens=4, background=True)
        for _ in range(600):
            background = sdk.responses.retrieve(background.id)
            if background.status not in ("queued", "in_progress"):
                break
            time.sleep(0.05)
        assert background.status in ("completed", "incomplete")
        follow = sdk.responses.create(model="demo", input="And?", max_output_tokens=4,
                                      previous_response_id=plain.id)
        assert owner(follow.id) == owner(plain.id)
        conv = sdk.conversations.create(metadata={"sdk": "yes"})
        turn = sdk.responses.create(model="demo", input="In a conversation", max_output_tokens=4,
                                    conversation=conv.id)
        assert owner(turn.id) == owner(conv.id)
        assert len(sdk.conversations.items.list(conv.id).data) >= 2


def test_a_killed_box_answers_503_and_recovers_every_task(fleet, clients, made):
    responses, _ = made
    client = clients[0]
    acked: dict[str, list[str]] = {box: [] for box in BOXES}
    for n in range(9):
        got = client.post("/v1/responses", {**SMALL, "input": f"k{n}", "background": True,
                                            "max_output_tokens": 400, "on_restart": "resume"})
        assert got.status == 202
        acked[owner(got.body["id"])].append(got.body["id"])
    victim = fleet.servers["c"]
    victim.crash()
    before = StoreView.load(open_copy(copy_db(victim.data_dir, fleet.root / "c-copy")))
    theirs = [(c, body["id"]) for c, body in responses if owner(body["id"]) == "c"]
    for holder, rid in theirs[:3] + [(client, rid) for rid in acked["c"]]:
        got = holder.get(f"/v1/responses/{rid}")
        assert got.status == 503 and got.error_code == "box_unavailable", got.body
        assert got.headers.get("retry-after")
    for n in range(6):
        got = client.post("/v1/responses", {**SMALL, "input": f"while down {n}", "background": True})
        assert got.status == 202, got.body
        assert owner(got.body["id"]) != "c"
        acked[owner(got.body["id"])].append(got.body["id"])
    victim.start()
    after = StoreView.load(open_live(victim.data_dir))
    assert check_recovery(before, after) == []
    assert check_acknowledged(acked["c"], after, "after the restart") == []
    for box in ("a", "b"):
        assert check_acknowledged(acked[box], StoreView.load(open_live(fleet.servers[box].data_dir)), "live") == []
    for rid in acked["c"]:
        assert client.get(f"/v1/responses/{rid}").status == 200
    # it takes its share again once nginx's fail_timeout (5 s) has passed
    deadline, seen = time.monotonic() + 60, []
    while "c" not in seen and time.monotonic() < deadline:
        got = client.post("/v1/responses", {**SMALL, "input": "back?", "background": True})
        if got.status == 503 and "retry-after" in got.headers:  # a box busy catching up: asked again
            seen.append(f"503 {got.error_code}")
            continue
        assert got.status == 202, got.body
        seen.append(owner(got.body["id"]))
        time.sleep(0.2)
    assert "c" in seen, seen
