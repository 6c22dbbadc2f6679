"""Which turns write a KV file (demo model): those the service can continue, a
stored response (a ``previous_response_id`` can continue it) and a response in a
conversation; never a ``store: false`` response, a chat completion or a
completion. Both ways a task starts: claimed by the scheduler, and started early
by its creation's admission."""
from __future__ import annotations

import time

import pytest
from runtime_helpers import queued, wait_finished

from lmsp import kv
from lmsp.contracts import NewTask
from lmsp.runtime.kv import continuable

TEXT = "A story about a lighthouse"


def created(db, rt, kind: str = "response", conversation: str | None = None, **request) -> tuple[str, str]:
    """A task the scheduler claims; its (task id, response id), once finished."""
    body = {"model": "tiny", "temperature": 0.0, "max_output_tokens": 4, **request}
    if "prompt" not in body:
        body.setdefault("input", TEXT)
    if conversation is not None:
        body["conversation"] = {"id": conversation}
    made = db.create_task(client_id=None, model="tiny", request=body, on_restart="fail", background=False,
                             stream=False, kind=kind,
                             conversation=None if conversation is None else (conversation, version(db, conversation)))
    queued(rt)
    task = wait_finished(rt, db, made["task"]["id"])
    assert task["status"] == "completed", task
    return task["id"], made["response"]["id"]


def version(db, conversation: str) -> int:
    return db.conversation_items(conversation)[1]


def started_early(db, rt, kind: str = "response", **request) -> str:
    """A task created through the runtime's admission with a free slot (its sequence
    starts before its creation commits); its response id, once finished."""
    body = {"model": "tiny", "input": TEXT, "temperature": 0.0, "max_output_tokens": 4, **request}
    made = rt.create_task(NewTask(client_id=None, model="tiny", messages=[{"role": "user", "content": TEXT}],
                                  request=body, on_restart="fail", background=False, stream=False, kind=kind))
    assert made.get("claim") is not None  # claimed at its creation: the early start
    task = wait_finished(rt, db, made["task"]["id"])
    assert task["status"] == "completed", task
    return made["response"]["id"]


def owners_once(config, rt, written: int, timeout: float = 30.0) -> list[str | None]:
    """The owners of the KV files once the runtime has written ``written`` of them (the
    KV thread writes in the order the turns ended: what ended before is done too)."""
    deadline = time.monotonic() + timeout
    while rt.metrics()["kv_file_files_written"] < written:
        assert time.monotonic() < deadline, f"no KV file after {timeout} s: {list(config.kv_dir.glob('*'))}"
        time.sleep(0.05)
    return sorted(e.owner or "" for e in kv.entries(config.kv_dir))


def test_only_stored_responses_and_conversation_turns_write_a_file(store, runtime, config):
    created(store, runtime, store=False)
    created(store, runtime, kind="chat.completion", store=True)  # a stored completion: no id continues it
    created(store, runtime, kind="text_completion", prompt="Once upon a time", store=False)
    conv = store.create_conversation(None, {}, [])["id"]
    _, kept = created(store, runtime, input="Tell me of mountains and rivers")  # stored (the default)
    created(store, runtime, conversation=conv, store=False, input="Of seas and islands far away")
    assert owners_once(config, runtime, 2) == sorted([kept, conv])
    runtime.stop(timeout=5.0)  # a graceful stop writes what is queued: nothing more
    assert runtime.metrics()["kv_file_files_written"] == 2


def test_a_task_started_early_writes_a_file_only_when_it_can_be_continued(store, runtime, config):
    created(store, runtime, store=False)  # loads the model, writes nothing
    started_early(store, runtime, store=False)
    started_early(store, runtime, kind="chat.completion")
    kept = started_early(store, runtime, input="Tell me of mountains and rivers")
    assert owners_once(config, runtime, 1) == [kept]
    runtime.stop(timeout=5.0)
    assert runtime.metrics()["kv_file_files_written"] == 1


@pytest.mark.parametrize(
    ("request_", "kind", "response_id", "keep"),
    [
        ({}, "response", "", True),
        ({"store": True}, "", "resp_1", True),
        ({"store": False}, "response", "", False),
        ({"store": False, "conversation": {"id": "conv_1"}}, "", "resp_1", True),
        ({"store": True}, "chat.completion", "", False),
        ({"store": True}, "", "chatcmpl-1", False),
        ({}, "text_completion", "", False),
        ({}, "", "cmpl-1", False),
        ({}, "embedding", "", False),
    ],
)
def test_continuable(request_, kind, response_id, keep):
    assert continuable(request_, kind=kind, response_id=response_id) is keep
