"""The KV files of conversations and chains of responses (demo model): a turn tags
its file with what owns it, and the janitor's next round deletes the files of a
deleted conversation, of a chain whose responses are all deleted, of a chain
that retention takes and of a stored response in no chain that is deleted (its
file is tagged with its own id, the name of the chain it would start), and keeps
every other file."""
from __future__ import annotations

import time

from runtime_helpers import queued, wait_finished

from lmsp import kv
from lmsp.service import turns as context


def respond(store, rt, text: str, **body) -> dict:
    """A finished response to ``text`` that continues what ``body`` names (a
    ``conversation`` or a ``previous_response_id``), created as the web layer does."""
    earlier = context.load(store, None, {"input": text, **body})
    request = {"model": "tiny", "input": text, "temperature": 0.0, "max_output_tokens": 4, **earlier.fields({})}
    created = store.create_task(client_id=None, model="tiny", request=request, on_restart="fail",
                                background=True, stream=False, conversation=earlier.conversation)
    queued(rt)
    task = wait_finished(rt, store, created["task"]["id"])
    assert task["status"] == "completed", task
    return task


def owners(config, rt, written: int, timeout: float = 30.0) -> dict[str | None, int]:
    """How many KV files each owner has, once the runtime has written ``written``."""
    deadline = time.monotonic() + timeout
    while rt.metrics()["kv_file_files_written"] < written:
        assert time.monotonic() < deadline, f"no KV file after {timeout} s: {list(config.kv_dir.glob('*'))}"
        time.sleep(0.05)
    out: dict[str | None, int] = {}
    for entry in kv.entries(config.kv_dir):
        out[entry.owner] = out.get(entry.owner, 0) + 1
    return out


def conversation(store) -> str:
    return store.create_conversation(None, {}, [])["id"]


def test_a_deleted_conversations_file_goes_at_the_next_round_and_another_stays(store, runtime, config):
    mine, theirs = conversation(store), conversation(store)
    respond(store, runtime, "A story about a lighthouse", conversation=mine)
    respond(store, runtime, "Tell me of mountains and rivers", conversation=theirs)
    assert owners(config, runtime, 2) == {mine: 1, theirs: 1}
    assert runtime.janitor.round().get("kv_orphans", 0) == 0  # both are held: nothing goes
    store.delete_conversation(mine)
    assert runtime.janitor.round()["kv_orphans"] == 1
    assert owners(config, runtime, 2) == {theirs: 1}


def chain(store, rt) -> tuple[str, str]:
    """Two responses, the second continuing the first: their ids (the first is the chain's)."""
    first = respond(store, rt, "A story about a lighthouse")["response_id"]
    second = respond(store, rt, "And then?", previous_response_id=first)["response_id"]
    return first, second


def test_a_chain_whose_responses_are_all_deleted_loses_its_files(store, runtime, config):
    other = conversation(store)
    respond(store, runtime, "Tell me of mountains and rivers", conversation=other)
    first, second = chain(store, runtime)
    found = owners(config, runtime, 3)
    assert found[first] == 1 and found[other] == 1  # the second turn's file is the chain's
    store.delete_response(first)  # the chain lives on in its newest response
    runtime.janitor.round()
    assert owners(config, runtime, 3)[first] == 1
    store.delete_response(second)
    assert runtime.janitor.round()["kv_orphans"] == 1
    found = owners(config, runtime, 3)
    assert first not in found and found[other] == 1


def test_a_chain_that_retention_takes_loses_its_files(store, runtime, config):
    other = conversation(store)
    respond(store, runtime, "Tell me of mountains and rivers", conversation=other)
    first, _ = chain(store, runtime)
    assert owners(config, runtime, 3)[first] == 1
    real_clock = store._clock
    store._clock = lambda: real_clock() + 8 * 86400.0  # past the 7 days of retention
    counts = runtime.janitor.round()
    assert counts["tasks"] >= 2 and counts["kv_orphans"] == 1
    found = owners(config, runtime, 3)
    assert first not in found and found[other] == 1  # a conversation is not retention's


def test_a_first_response_owns_its_file_under_its_chains_name_and_takes_it_along(store, runtime, config):
    other = conversation(store)
    respond(store, runtime, "Tell me of mountains and rivers", conversation=other)
    first = respond(store, runtime, "A story about a lighthouse")["response_id"]
    assert owners(config, runtime, 2) == {first: 1, other: 1}  # no chain yet: its own id
    assert runtime.janitor.round().get("kv_orphans", 0) == 0
    store.delete_response(first)  # the chain's only response
    assert runtime.janitor.round()["kv_orphans"] == 1
    assert owners(config, runtime, 2) == {other: 1}


def test_a_continued_first_responses_file_is_replaced_by_its_chains_next(store, runtime, config):
    first = respond(store, runtime, "A story about a lighthouse")
    assert owners(config, runtime, 1) == {first["response_id"]: 1}
    second = respond(store, runtime, "And then?", previous_response_id=first["response_id"])
    assert store.kv_owner(second["id"]) == store.kv_owner(first["id"]) == first["response_id"]  # the chain's id
    assert owners(config, runtime, 2) == {first["response_id"]: 1}  # the chain's newest turn only
