"""A function call's output in the store: its item opened with the call's head, its
arguments' deltas, its tail on the arguments' done event, so that the attempt's text
(and a resume's snapshot) is the output's text whole; the Response shows the call.
Parallel calls: each its own item, output index and ids, the one before done when the
next opens. Text deltas that keep log probabilities are read back the same."""
from __future__ import annotations

from store_checks import assert_consistent, event_types

from lmsp.objects import CHAT_OPEN
from lmsp.runtime.chat_shaper import ChatShaper
from lmsp.store import Store

TOOLS = [{"type": "function", "name": "f", "description": None, "parameters": {"type": "object"}, "strict": True}]
REQUEST = {"model": "tiny", "input": "hi", "max_output_tokens": 64, "seed": 1, "tools": TOOLS,
           "tool_choice": "required"}
HEAD = '{"name": "f", "arguments": '


def test_a_call_is_written_and_read_back(store: Store, running_task):
    tid = running_task(request=REQUEST)
    store.append_step("w1", [{"task_id": tid, "delta": "", "tokens": [1, 2]}])  # the head held back
    store.append_step("w1", [{"task_id": tid, "delta": "", "tokens": [3], "calls": [
        {"index": 0, "call": {"name": "f", "head": HEAD}, "args": '{"a"'}]}])
    assert store.output_text(tid) == HEAD + '{"a"'
    running = store.get_response(store.get_task(tid)["response_id"])
    [item] = running["output"]
    assert (item["type"], item["name"], item["arguments"], item["status"]) == ("function_call", "f", '{"a"',
                                                                             "in_progress")
    store.append_step("w1", [{"task_id": tid, "delta": "", "tokens": [4, 5], "calls": [
        {"index": 0, "args": ": 1}", "tail": "}"}], "finish": "stop",
        "usage": {"input_tokens": 3, "output_tokens": 5}}])
    assert_consistent(store, tid)
    events = store.events(tid, after=0)["data"]
    types = event_types(store, tid)
    added = events[types.index("response.output_item.added")]
    assert added["item"]["type"] == "function_call" and added["item"]["arguments"] == ""
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert [d["delta"] for d in deltas] == ['{"a"', ": 1}"]
    assert all(d["item_id"] == added["item"]["id"] and d["output_index"] == 0 for d in deltas)
    done = events[types.index("response.function_call_arguments.done")]
    assert done["arguments"] == '{"a": 1}'
    assert events[types.index("response.output_item.done")]["item"]["status"] == "completed"
    assert "response.output_text.delta" not in types and "response.content_part.added" not in types
    final = store.get_response(store.get_task(tid)["response_id"])
    [item] = final["output"]
    assert (item["arguments"], item["status"], item["id"]) == ('{"a": 1}', "completed", added["item"]["id"])
    assert store.output_text(tid) == HEAD + '{"a": 1}}'


def test_parallel_calls_are_items_of_their_own(store: Store, running_task):
    tid = running_task(on_restart="resume", request=REQUEST)
    second = '\n{"name": "f", "arguments": '
    store.append_step("w1", [{"task_id": tid, "delta": "", "tokens": [1, 2, 3], "calls": [
        {"index": 0, "call": {"name": "f", "head": HEAD}, "args": '{"a": 1}'}]}])
    store.append_step("w1", [{"task_id": tid, "delta": "", "tokens": [4], "calls": [
        {"index": 0, "args": "", "done": {"tail": "}", "name": "f", "arguments": '{"a": 1}'}},
        {"index": 1, "call": {"name": "f", "head": second}, "args": '{"b"'}]}])
    running = store.get_response(store.get_task(tid)["response_id"])
    assert [(i["arguments"], i["status"]) for i in running["output"]] == [('{"a": 1}', "completed"),
                                                                           ('{"b"', "in_progress")]
    with store._db.read() as conn:
        resume = store._resume(conn, store._task(conn, tid))
    assert resume["emitted"] == HEAD + '{"a": 1}}' + second + '{"b"' and resume["generated"] == [1, 2, 3, 4]
    store.append_step("w1", [{"task_id": tid, "delta": "", "tokens": [5], "calls": [
        {"index": 1, "args": ": 2}", "tail": "}"}], "finish": "stop",
        "usage": {"input_tokens": 3, "output_tokens": 5}}])
    assert_consistent(store, tid)
    events = store.events(tid, after=0)["data"]
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["output_index"] for e in added] == [0, 1]
    ids = [(e["item"]["id"], e["item"]["call_id"]) for e in added]
    assert len({i for pair in ids for i in pair}) == 4
    dones = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [(d["output_index"], d["item_id"], d["arguments"]) for d in dones] == [
        (0, ids[0][0], '{"a": 1}'), (1, ids[1][0], '{"b": 2}')]
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert [(d["output_index"], d["delta"]) for d in deltas] == [(0, '{"a": 1}'), (1, '{"b"'), (1, ": 2}")]
    items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    final = store.get_response(store.get_task(tid)["response_id"])
    assert final["output"] == items and [i["id"] for i in items] == [i[0] for i in ids]
    assert all(i["status"] == "completed" for i in items)
    assert store.output_text(tid) == HEAD + '{"a": 1}}' + second + '{"b": 2}}'


def test_a_running_calls_snapshot_is_its_committed_text_and_tokens(store: Store, running_task):
    tid = running_task(on_restart="resume", request=REQUEST)
    store.append_step("w1", [{"task_id": tid, "delta": "", "tokens": [1, 2]}])
    store.append_step("w1", [{"task_id": tid, "delta": "", "tokens": [3], "calls": [
        {"index": 0, "call": {"name": "f", "head": HEAD}, "args": "{"}]}])
    store.append_step("w1", [{"task_id": tid, "delta": "", "tokens": [4]}])  # a possible tail, held back
    with store._db.read() as conn:
        resume = store._resume(conn, store._task(conn, tid))
    # the held-back token has no committed text: the engine samples it (and its text) again
    assert resume["generated"] == [1, 2, 3]
    assert resume["emitted"] == HEAD + "{"


def test_a_text_output_with_log_probabilities_is_read_back_whole(store: Store, running_task):
    """Delta rows that keep log probabilities in ``data`` are text rows all the same: the
    attempt's text, the resume snapshot and the done event take them."""
    tid = running_task(on_restart="resume", request={"model": "tiny", "input": "hi", "max_output_tokens": 64,
                                                     "seed": 1, "top_logprobs": 1})
    entry = {"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": []}
    store.append_step("w1", [{"task_id": tid, "delta": "Hi", "tokens": [7], "logprobs": [entry]}])
    store.append_step("w1", [{"task_id": tid, "delta": "!", "tokens": [8], "logprobs": [{**entry, "token": "!"}]}])
    with store._db.read() as conn:
        resume = store._resume(conn, store._task(conn, tid))
    assert (resume["generated"], resume["emitted"]) == ([7, 8], "Hi!")
    assert [e["token"] for e in resume["logprobs"]] == ["Hi", "!"]
    # a token held back without text (part of a character, a possible stop string) had its
    # log probabilities in memory only: the resume leaves it to be sampled again with them
    store.append_step("w1", [{"task_id": tid, "delta": "", "tokens": [9], "logprobs": [{**entry, "token": "?"}]}])
    with store._db.read() as conn:
        resume = store._resume(conn, store._task(conn, tid))
    assert (resume["generated"], resume["emitted"]) == ([7, 8], "Hi!")
    assert [e["token"] for e in resume["logprobs"]] == ["Hi", "!"]
    store.append_step("w1", [{"task_id": tid, "delta": "", "tokens": [], "finish": "stop",
                              "usage": {"input_tokens": 3, "output_tokens": 2}}])
    assert_consistent(store, tid)
    assert store.output_text(tid) == "Hi!"
    done = [e for e in store.events(tid, after=0)["data"] if e["type"] == "response.output_text.done"]
    assert done[0]["text"] == "Hi!" and [lp["token"] for lp in done[0]["logprobs"]] == ["Hi", "!"]


def test_chat_rows_hold_back_the_tokens_after_the_text_they_took(store: Store, running_task):
    """On the chat layer a step's tokens go on its last row with text, except its
    ``held_tokens`` (their text not shown yet): those wait, like a token without text,
    and a resume samples them again."""
    tid = running_task(on_restart="resume", request={"model": "tiny", "input": "hi", "max_output_tokens": 64})
    shaper = ChatShaper(lambda text, partial: {"content": text}, "msg_1")

    def step(text: str, tokens: list[int], held: list[int]) -> dict:
        shaper.push(text, False)
        return {"task_id": tid, "delta": "", "tokens": tokens, "held_tokens": held, "rows": shaper.made(),
                "mark": CHAT_OPEN}

    def resume() -> tuple[list[int], str]:
        with store._db.read() as conn:
            found = store._resume(conn, store._task(conn, tid))
        return found["generated"], found["emitted"]

    store.append_step("w1", [step("Hi", [7], [8])])
    assert resume() == ([7], "Hi")
    store.append_step("w1", [step("", [], [9])])  # nothing shown: all held
    assert resume() == ([7], "Hi")
    store.append_step("w1", [step("!", [10], [])])
    assert resume() == ([7, 8, 9, 10], "Hi!")
