"""Conversations (LMSP B.11) with the scripted worker: the objects, their items,
pages, the 20-item limits, isolation, and responses that continue them."""
from __future__ import annotations

import pytest
from api_helpers import Api, assert_error, make_client

SAID = "Hello from the scripted worker"


def conversation(api, **body) -> dict:
    result = api.post("/v1/conversations", json=body)
    assert result.status_code == 200, result.text
    return result.json


def say(api, conv: str | dict, text: str, **fields):
    return api.post("/v1/responses", json={"model": "tiny", "input": text, "conversation": conv, **fields})


def items(api, cid: str, query: str = "order=asc&limit=100") -> list[dict]:
    page = api.get(f"/v1/conversations/{cid}/items?{query}")
    assert page.status_code == 200, page.text
    return page.json["data"]


def contents(data: list[dict]) -> list[tuple[str, str]]:
    return [(d["role"], d["content"][0]["text"]) for d in data]


def test_create_get_update_delete(user):
    conv = conversation(user, metadata={"topic": "demo"}, items=[{"role": "user", "content": "hi"}])
    assert conv["id"].startswith("conv_") and conv["object"] == "conversation"
    assert conv["metadata"] == {"topic": "demo"} and isinstance(conv["created_at"], int)
    assert user.get(f"/v1/conversations/{conv['id']}").json == conv
    updated = user.post(f"/v1/conversations/{conv['id']}", json={"metadata": {"topic": "other"}}).json
    assert updated == {**conv, "metadata": {"topic": "other"}}
    assert contents(items(user, conv["id"])) == [("user", "hi")]
    gone = user.delete(f"/v1/conversations/{conv['id']}").json
    assert gone == {"id": conv["id"], "object": "conversation.deleted", "deleted": True}
    assert_error(user.get(f"/v1/conversations/{conv['id']}"), 404, "not_found")
    assert_error(user.get(f"/v1/conversations/{conv['id']}/items"), 404, "not_found")


def test_an_empty_body_makes_an_empty_conversation(user):
    result = user.post("/v1/conversations")
    assert result.status_code == 200, result.text
    assert result.json["metadata"] == {} and items(user, result.json["id"]) == []


def test_items_add_get_delete_and_pages(user):
    cid = conversation(user)["id"]
    added = user.post(f"/v1/conversations/{cid}/items", json={"items": [
        {"role": "user", "content": f"m{i}"} for i in range(5)]}).json
    assert added["object"] == "list" and len(added["data"]) == 5 and added["has_more"] is False
    assert added["first_id"] == added["data"][0]["id"] and added["data"][0]["id"].startswith("msg_")
    assert [t for _, t in contents(items(user, cid, ""))] == ["m4", "m3", "m2", "m1", "m0"]  # newest first
    page = user.get(f"/v1/conversations/{cid}/items?order=asc&limit=2").json
    assert [t for _, t in contents(page["data"])] == ["m0", "m1"] and page["has_more"] is True
    rest = user.get(f"/v1/conversations/{cid}/items?order=asc&after={page['last_id']}").json
    assert [t for _, t in contents(rest["data"])] == ["m2", "m3", "m4"] and rest["has_more"] is False
    one = added["data"][2]
    assert user.get(f"/v1/conversations/{cid}/items/{one['id']}").json == one
    conv = user.delete(f"/v1/conversations/{cid}/items/{one['id']}").json
    assert conv["id"] == cid and conv["object"] == "conversation"
    assert [t for _, t in contents(items(user, cid))] == ["m0", "m1", "m3", "m4"]
    assert_error(user.get(f"/v1/conversations/{cid}/items/{one['id']}"), 404, "not_found")
    assert_error(user.delete(f"/v1/conversations/{cid}/items/{one['id']}"), 404, "not_found")
    assert_error(user.get(f"/v1/conversations/{cid}/items?after=msg_nope"), 400, "invalid_request", "after")


def test_twenty_items_at_most_in_one_request(user):
    twenty = [{"role": "user", "content": str(i)} for i in range(20)]
    cid = conversation(user, items=twenty)["id"]
    assert len(items(user, cid)) == 20
    assert_error(user.post("/v1/conversations", json={"items": twenty + twenty[:1]}), 400, "invalid_request", "items")
    assert user.post(f"/v1/conversations/{cid}/items", json={"items": twenty}).status_code == 200
    assert_error(user.post(f"/v1/conversations/{cid}/items", json={"items": twenty + twenty[:1]}),
                 400, "invalid_request", "items")
    assert_error(user.post(f"/v1/conversations/{cid}/items", json={"items": []}), 400, "invalid_request", "items")
    assert len(items(user, cid)) == 40


@pytest.mark.parametrize("body,param", [
    ({"items": "hi"}, "items"),
    ({"items": [{"role": "robot", "content": "x"}]}, "items[0].role"),
    ({"items": [{"type": "web_search_call"}]}, "items[0].type"),
    ({"metadata": {"k": 1}}, "metadata.k"),
    ({"title": "x"}, "title"),
])
def test_bad_bodies(user, body, param):
    assert_error(user.post("/v1/conversations", json=body), 400, "invalid_request", param)


def test_isolation_bad_ids_and_scopes(user, other, store, app):
    cid = conversation(user, items=[{"role": "user", "content": "secret"}])["id"]
    item = items(user, cid)[0]["id"]
    for call in (lambda a: a.get(f"/v1/conversations/{cid}"),
                 lambda a: a.post(f"/v1/conversations/{cid}", json={"metadata": {}}),
                 lambda a: a.get(f"/v1/conversations/{cid}/items"),
                 lambda a: a.post(f"/v1/conversations/{cid}/items", json={"items": [{"role": "user", "content": "x"}]}),
                 lambda a: a.get(f"/v1/conversations/{cid}/items/{item}"),
                 lambda a: a.delete(f"/v1/conversations/{cid}/items/{item}"),
                 lambda a: a.delete(f"/v1/conversations/{cid}")):
        assert_error(call(other), 404, "not_found")
    assert_error(say(other, cid, "tell me"), 404, "not_found", "conversation")
    for bad in ("conv_nope", "resp_x", "x" * 200):
        assert_error(user.get(f"/v1/conversations/{bad}"), 404, "not_found")
        assert_error(say(user, bad, "hi"), 404, "not_found", "conversation")
    assert_error(say(user, {"id": 5}, "hi"), 400, "invalid_request", "conversation")
    reader = Api(app, make_client(store, ["responses:read"], "reader")[1])
    assert reader.get(f"/v1/conversations/{cid}").status_code == 404  # another client still
    assert_error(reader.post("/v1/conversations", json={}), 403, "insufficient_scope")
    assert contents(items(user, cid)) == [("user", "secret")]


def test_a_response_reads_the_conversation_and_appends_its_turn(user, scripted):
    cid = conversation(user, items=[{"role": "user", "content": "My name is Alice."},
                                    {"role": "assistant", "content": "Hello Alice."}])["id"]
    first = say(user, cid, "What is my name?", instructions="Be brief.")
    assert first.status_code == 200, first.text
    assert first.json["conversation"] == {"id": cid} and first.json["previous_response_id"] is None
    assert scripted.checked == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "My name is Alice."},
                                {"role": "assistant", "content": "Hello Alice."},
                                {"role": "user", "content": "What is my name?"}]
    listed = items(user, cid)
    assert contents(listed) == [("user", "My name is Alice."), ("assistant", "Hello Alice."),
                                ("user", "What is my name?"), ("assistant", SAID)]
    assert listed[3]["id"] == first.json["output"][0]["id"]  # the output item keeps its id
    inputs = user.get(f"/v1/responses/{first.json['id']}/input_items").json["data"]
    assert listed[2]["id"] == inputs[0]["id"]  # so does the input item
    second = say(user, {"id": cid}, "And again?")
    assert second.status_code == 200 and second.json["conversation"] == {"id": cid}
    assert [m["content"] for m in scripted.checked][-3:] == ["What is my name?", SAID, "And again?"]
    assert len(items(user, cid)) == 6


def test_one_response_in_progress_per_conversation(user, scripted):
    cid = conversation(user)["id"]
    scripted.auto = False
    key = {"Idempotency-Key": "turn-1"}
    body = {"model": "tiny", "input": "one", "conversation": cid, "background": True}
    running = user.post("/v1/responses", json=body, headers=key)
    assert running.status_code == 202, running.text
    assert_error(say(user, cid, "two"), 409, "conversation_busy", "conversation")
    replay = user.post("/v1/responses", json=body, headers=key)  # a replay is not a second response
    assert replay.status_code == 202 and replay.json["id"] == running.json["id"]
    assert items(user, cid) == []  # nothing until the turn ends
    for claim in scripted.start_all():
        scripted.finish(claim["task_id"], "done")
    assert contents(items(user, cid)) == [("user", "one"), ("assistant", "done")]
    scripted.auto = True
    assert say(user, cid, "two").status_code == 200


def test_a_cancelled_turn_appends_what_it_committed_and_frees_the_conversation(user, scripted):
    cid = conversation(user)["id"]
    scripted.auto = False
    queued = say(user, cid, "one", background=True).json
    assert user.post(f"/v1/responses/{queued['id']}/cancel").status_code == 200
    assert contents(items(user, cid)) == [("user", "one")]
    scripted.auto = True
    assert say(user, cid, "two").status_code == 200


def test_a_deleted_conversation_is_not_continued_and_its_turn_goes_nowhere(user, scripted):
    cid = conversation(user)["id"]
    scripted.auto = False
    queued = say(user, cid, "one", background=True).json
    assert user.delete(f"/v1/conversations/{cid}").status_code == 200
    for claim in scripted.start_all():
        scripted.finish(claim["task_id"], "done")
    assert user.get(f"/v1/responses/{queued['id']}").json["status"] == "completed"
    assert_error(say(user, cid, "two"), 404, "not_found", "conversation")


def test_store_false_keeps_the_turn_in_the_conversation(user):
    cid = conversation(user)["id"]
    assert say(user, cid, "one", store=False).status_code == 200
    assert contents(items(user, cid)) == [("user", "one"), ("assistant", SAID)]


def test_a_call_without_a_name_does_not_stop_the_conversation(user, scripted):
    cid = conversation(user)["id"]
    scripted.auto = False
    tools = [{"type": "function", "name": "weather"}]
    assert say(user, cid, "one", background=True, tools=tools, tool_choice="required").status_code == 202
    [claim] = scripted.start_all()
    scripted.finish(claim["task_id"], '{"name": "", "arguments": {', finish="error")
    listed = items(user, cid)
    assert [i["type"] for i in listed] == ["message", "function_call"] and listed[1]["name"] == ""
    scripted.auto = True
    assert say(user, cid, "two").status_code == 200
    assert [m["content"] for m in scripted.checked] == ["one", "two"]


def test_a_response_keeps_at_most_what_the_model_could_see_of_a_long_conversation(user, scripted, config):
    cid = conversation(user, items=[{"role": "developer", "content": "Be brief."}])["id"]
    long = "x" * 2000
    for n in range(4):  # 80,000 characters: more than a context of 256 tokens can ever hold
        added = user.post(f"/v1/conversations/{cid}/items", json={"items": [
            {"role": "user", "content": f"{n}.{i} {long}"} for i in range(10)]})
        assert added.status_code == 200, added.text
    assert_error(say(user, cid, "and?"), 400, "context_length_exceeded", "conversation")
    assert len(items(user, cid)) == 41  # refused: nothing appended
    answered = say(user, cid, "and?", truncation="auto")
    assert answered.status_code == 200, answered.text
    kept = [m["content"] for m in scripted.checked]
    assert kept[0] == "Be brief." and kept[-1] == "and?"  # the system message stays, the oldest turns go
    assert sum(map(len, kept[1:-1])) <= config.n_ctx * 256 < sum(map(len, kept)) + len(long) + 10
    assert kept[1:-1] == [f"{n}.{i} {long}" for n in range(4) for i in range(10)][-len(kept[1:-1]):]


def test_items_added_while_a_turn_runs_are_refused_and_the_turn_goes_first(user, scripted):
    """The model made the turn without them: they cannot go before it (nor among the items
    it was made from), so they are refused, as a second response is, until it ends."""
    cid = conversation(user, items=[{"role": "user", "content": "zero"}])["id"]
    scripted.auto = False
    assert say(user, cid, "one", background=True).status_code == 202
    late = {"items": [{"role": "user", "content": "late"}]}
    key = {"Idempotency-Key": "late-1"}
    refused = assert_error(user.post(f"/v1/conversations/{cid}/items", json=late, headers=key),
                           409, "conversation_busy")
    assert "in progress" in refused["message"]
    assert contents(items(user, cid)) == [("user", "zero")]
    for claim in scripted.start_all():
        scripted.finish(claim["task_id"], "done")
    added = user.post(f"/v1/conversations/{cid}/items", json=late, headers=key)  # the key was not spent
    assert added.status_code == 200 and "Idempotent-Replayed" not in added.headers, added.text
    assert contents(items(user, cid)) == [("user", "zero"), ("user", "one"), ("assistant", "done"), ("user", "late")]


CALL = {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "sunny"}


def test_a_call_output_answers_a_call_before_it_in_the_conversation(user, scripted):
    ask = {"role": "user", "content": "weather?"}
    assert_error(user.post("/v1/conversations", json={"items": [OUTPUT]}), 400, "invalid_request", "items[0].call_id")
    assert_error(user.post("/v1/conversations", json={"items": [ask, OUTPUT, CALL]}),
                 400, "invalid_request", "items[1].call_id")
    assert conversation(user, items=[ask, CALL, OUTPUT])["id"]  # its call before it in the same items
    cid = conversation(user, items=[ask, CALL])["id"]
    assert_error(user.post(f"/v1/conversations/{cid}/items", json={"items": [{**OUTPUT, "call_id": "c2"}]}),
                 400, "invalid_request", "items[0].call_id")
    assert len(items(user, cid)) == 2  # nothing added
    added = user.post(f"/v1/conversations/{cid}/items", json={"items": [OUTPUT]})  # its call: in the conversation
    assert added.status_code == 200, added.text
    assert [i["type"] for i in items(user, cid)] == ["message", "function_call", "function_call_output"]
    answered = say(user, cid, [{**OUTPUT, "output": "rainy"}])  # a response's input answers it too
    assert answered.status_code == 200, answered.text


def test_a_call_deleted_from_the_conversation_is_answered_no_more(user, scripted):
    cid = conversation(user, items=[{"role": "user", "content": "weather?"}, CALL, OUTPUT])["id"]
    call_item = items(user, cid)[1]
    assert user.delete(f"/v1/conversations/{cid}/items/{call_item['id']}").status_code == 200
    assert_error(say(user, cid, [OUTPUT]), 400, "invalid_request", "input[0].call_id")
    assert_error(user.post(f"/v1/conversations/{cid}/items", json={"items": [OUTPUT]}),
                 400, "invalid_request", "items[0].call_id")
    assert say(user, cid, "and now?").status_code == 200  # its old output is still read


def test_items_checked_against_calls_that_changed_since_are_refused(user, store):
    from lmsp.errors import ConversationBusy

    cid = conversation(user, items=[CALL])["id"]
    version = store.conversation_items(cid)[1]
    user.post(f"/v1/conversations/{cid}/items", json={"items": [{"role": "user", "content": "x"}]})
    with pytest.raises(ConversationBusy):
        store.add_conversation_items(cid, [{"id": "fco_1", **OUTPUT}], version=version)
    assert len(items(user, cid)) == 2
