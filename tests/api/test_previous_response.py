"""``previous_response_id`` (LMSP B.11) with the scripted worker: the model sees the
earlier turns, chains of any length, the previous response's checks, and a chain
that outlives its older responses."""
from __future__ import annotations

import json
import sqlite3

from api_helpers import assert_error

SAID = "Hello from the scripted worker"


def create(api, **fields):
    body = {"model": "tiny", "input": "Say hello"}
    body.update(fields)
    return api.post("/v1/responses", json=body)


def turn(api, text: str, previous: str | None = None, **fields) -> dict:
    if previous is not None:
        fields["previous_response_id"] = previous
    result = create(api, input=text, **fields)
    assert result.status_code == 200, result.text
    return result.json


def test_the_model_sees_the_previous_turns_but_not_their_instructions(user, scripted):
    first = turn(user, "My name is Alice.", instructions="Be brief.")
    second = turn(user, "What is my name?", first["id"], instructions="Answer in French.")
    assert scripted.checked == [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "My name is Alice."},
        {"role": "assistant", "content": SAID},
        {"role": "user", "content": "What is my name?"},
    ]
    assert second["previous_response_id"] == first["id"] and first["previous_response_id"] is None
    assert user.get(f"/v1/responses/{second['id']}").json["previous_response_id"] == first["id"]


def test_a_chain_of_any_length(user, scripted):
    previous = None
    for i in range(6):
        previous = turn(user, f"turn {i}", previous)["id"]
    assert [m["content"] for m in scripted.checked] == [
        text for i in range(6) for text in (f"turn {i}", SAID)
    ][:-1]


def test_a_chain_never_breaks_while_its_newest_response_exists(user, scripted):
    first = turn(user, "one")
    second = turn(user, "two", first["id"])
    assert user.delete(f"/v1/responses/{first['id']}").status_code == 200
    turn(user, "three", second["id"])
    assert [m["content"] for m in scripted.checked] == ["one", SAID, "two", SAID, "three"]
    # store: false delivery of a response deletes only that response
    fourth = turn(user, "four", second["id"], store=False)
    assert_error(user.get(f"/v1/responses/{fourth['id']}"), 404, "not_found")
    assert [m["content"] for m in scripted.checked] == ["one", SAID, "two", SAID, "four"]


def test_unknown_and_other_clients_responses_are_not_found(user, other):
    mine = turn(user, "mine")
    for value in ("resp_nope", "task_x", "msg_" + mine["id"][5:], "x" * 300):
        assert_error(create(user, previous_response_id=value), 404, "not_found", "previous_response_id")
    assert_error(create(other, previous_response_id=mine["id"]), 404, "not_found", "previous_response_id")
    for value in (7, "", ["resp_x"]):
        assert_error(create(user, previous_response_id=value), 400, "invalid_request", "previous_response_id")


def test_an_unstored_response_cannot_be_continued(user, config):
    first = turn(user, "hi")
    with sqlite3.connect(config.db_path) as conn:  # as a store: false response is before its delivery
        request = json.loads(conn.execute("SELECT request FROM responses WHERE id = ?", (first["id"],)).fetchone()[0])
        request["store"] = False
        conn.execute("UPDATE responses SET request = ? WHERE id = ?", (json.dumps(request), first["id"]))
    assert_error(create(user, previous_response_id=first["id"]), 400, "invalid_request", "previous_response_id")


def test_an_unfinished_response_cannot_be_continued_a_cancelled_one_can(user, scripted):
    scripted.auto = False
    queued = create(user, input="first words", background=True).json
    assert_error(create(user, previous_response_id=queued["id"]), 409, "task_unfinished", "previous_response_id")
    assert user.post(f"/v1/responses/{queued['id']}/cancel").status_code == 200
    scripted.auto = True
    turn(user, "again", queued["id"])
    assert [m["content"] for m in scripted.checked] == ["first words", "again"]  # it committed no output


def test_previous_response_id_and_conversation_together_are_refused(user):
    first = turn(user, "hi")
    assert_error(create(user, previous_response_id=first["id"], conversation="conv_x"), 400, "invalid_request")


def test_a_function_call_output_answers_a_call_of_the_previous_response(user, scripted):
    scripted.text = '{"name": "weather", "arguments": {"city": "Paris"}}'
    tools = [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]
    first = turn(user, "Weather in Paris?", tools=tools)
    call = first["output"][0]
    assert call["type"] == "function_call"
    scripted.text = "Sunny."
    second = create(user, previous_response_id=first["id"], tools=tools,
                    input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}])
    assert second.status_code == 200, second.text
    assert scripted.checked[-2]["role"] == "assistant" and '"weather"' in scripted.checked[-2]["content"]
    assert scripted.checked[-1]["content"].endswith("sunny") and call["call_id"] in scripted.checked[-1]["content"]
    # and again one response later: the call is still known
    third = create(user, previous_response_id=second.json["id"], tools=tools,
                   input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "still sunny"}])
    assert third.status_code == 200, third.text
    # a call id no turn made is refused
    assert_error(create(user, previous_response_id=first["id"],
                        input=[{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]),
                 400, "invalid_request", "input[0].call_id")


def test_an_idempotent_replay_is_answered_after_the_previous_response_is_gone(user):
    first = turn(user, "hi")
    key = {"Idempotency-Key": "chain-1"}
    body = {"model": "tiny", "input": "next", "previous_response_id": first["id"]}
    made = user.post("/v1/responses", json=body, headers=key)
    assert made.status_code == 200, made.text
    assert user.delete(f"/v1/responses/{first['id']}").status_code == 200
    again = user.post("/v1/responses", json=body, headers=key)
    assert again.status_code == 200 and again.headers.get("Idempotent-Replayed") == "true"
    assert again.json["id"] == made.json["id"]


def test_retention_counts_from_the_newest_response_of_a_chain(user, scripted, store, clock):
    first = turn(user, "one")
    second = turn(user, "two", first["id"])
    lone = turn(user, "alone")
    clock.advance(3600)
    third = turn(user, "three", second["id"])
    assert store.gc(retention=1800)["tasks"] == 1  # only the response in no chain is past its time
    assert_error(user.get(f"/v1/responses/{lone['id']}"), 404, "not_found")
    for kept in (first, second):  # a newer response continues them: they are kept, items too
        assert user.get(f"/v1/responses/{kept['id']}").status_code == 200
        assert user.get(f"/v1/responses/{kept['id']}/input_items").json["data"]
    turn(user, "four", second["id"])  # a branch of an older turn
    assert [m["content"] for m in scripted.checked] == ["one", SAID, "two", SAID, "four"]
    clock.advance(3600)
    assert store.gc(retention=1800)["tasks"] == 4  # the chain's newest is past its time: all of it goes
    for gone in (first, second, third):
        assert_error(user.get(f"/v1/responses/{gone['id']}"), 404, "not_found")
        assert_error(create(user, previous_response_id=gone["id"]), 404, "not_found", "previous_response_id")


def test_a_response_stores_its_own_turn_only_however_long_its_chain(user, scripted, config):
    previous, sizes = None, []
    for i in range(30):
        previous = turn(user, f"turn {i:02d} " + "x" * 200, previous, truncation="auto")["id"]
        with sqlite3.connect(config.db_path) as conn:
            sizes.append(conn.execute("SELECT length(request) FROM responses WHERE id = ?", (previous,)).fetchone()[0])
    assert len(set(sizes[1:])) == 1  # each continuation stores the same bytes, whatever came before
    assert len(scripted.checked) == 59  # and the model still sees every earlier turn


def test_a_response_that_kept_its_history_by_value_is_continued(user, scripted, config):
    first = turn(user, "three")
    with sqlite3.connect(config.db_path) as conn:  # as a response stored before chains kept their turns
        request = json.loads(conn.execute("SELECT request FROM responses WHERE id = ?", (first["id"],)).fetchone()[0])
        request["context"] = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}]
        conn.execute("UPDATE responses SET request = ? WHERE id = ?", (json.dumps(request), first["id"]))
    second = turn(user, "four", first["id"])
    turn(user, "five", second["id"])
    assert [m["content"] for m in scripted.checked] == ["one", "two", "three", SAID, "four", SAID, "five"]
