"""Log probabilities on Chat Completions and Completions (B.11) with the scripted
worker, whose tokens are the words of its text (each at -0.5, its alternatives
"alt1" at -1, "alt2" at -2...): OpenAI's shapes, the same plain, streamed,
replayed and stored."""
from __future__ import annotations

import pytest
from api_helpers import assert_error, parse_sse

from lmsp.api.openai_logprobs import LegacyLogprobs, legacy_logprobs
from lmsp.errors import NotFound

WORDS = ["Hello ", "from ", "the ", "scripted ", "worker"]


def chat(api, headers=None, **fields):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Say hello"}]}
    body.update(fields)
    return api.post("/v1/chat/completions", json=body, headers=headers)


def complete(api, headers=None, **fields):
    body = {"model": "tiny", "prompt": "Once upon"}
    body.update(fields)
    return api.post("/v1/completions", json=body, headers=headers)


def chunks_of(result) -> list[dict]:
    frames = parse_sse(result.text)
    assert frames[-1]["data"] == "[DONE]", frames
    return [f["data"] for f in frames[:-1]]


def test_chat_logprobs_in_openai_shape(user):
    choice = chat(user, logprobs=True, top_logprobs=2).json["choices"][0]
    content = choice["logprobs"]["content"]
    assert choice["logprobs"]["refusal"] is None
    assert [e["token"] for e in content] == WORDS
    first = content[0]
    assert first == {"token": "Hello ", "logprob": -0.5, "bytes": list(b"Hello "), "top_logprobs": [
        {"token": "Hello ", "logprob": -0.5, "bytes": list(b"Hello ")},
        {"token": "alt1", "logprob": -1.0, "bytes": list(b"alt1")}]}


def test_chat_logprobs_without_alternatives(user):
    content = chat(user, logprobs=True).json["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == WORDS and all(e["top_logprobs"] == [] for e in content)
    assert chat(user, logprobs=False).json["choices"][0]["logprobs"] is None


def test_chat_logprobs_same_streamed_replayed_and_stored(user):
    headers = {"Idempotency-Key": "chat-logprobs"}
    plain = chat(user, logprobs=True, top_logprobs=3, store=True).json
    chunks = chunks_of(chat(user, headers=headers, logprobs=True, top_logprobs=3, stream=True, store=True))
    streamed = [e for c in chunks for e in (c["choices"][0]["logprobs"] or {}).get("content", [])]
    assert streamed == plain["choices"][0]["logprobs"]["content"]
    # the role chunk and the finish chunk carry none, as OpenAI's
    assert chunks[0]["choices"][0]["logprobs"] is None and chunks[-1]["choices"][0]["logprobs"] is None
    text_chunks = [c for c in chunks if c["choices"][0]["delta"].get("content")]
    assert all(len(c["choices"][0]["logprobs"]["content"]) == 1 for c in text_chunks)
    replayed = chunks_of(chat(user, headers=headers, logprobs=True, top_logprobs=3, stream=True, store=True))
    assert replayed == chunks
    stored = user.get(f"/v1/chat/completions/{chunks[0]['id']}").json
    assert stored["choices"][0]["logprobs"]["content"] == streamed
    assert user.get(f"/v1/chat/completions/{plain['id']}").json["choices"] == plain["choices"]
    listed = {c["id"]: c for c in user.get("/v1/chat/completions").json["data"]}
    assert listed[plain["id"]]["choices"] == plain["choices"]


def test_a_stored_completion_without_logprobs_shows_none(user):
    made = chat(user, store=True).json
    assert user.get(f"/v1/chat/completions/{made['id']}").json["choices"][0]["logprobs"] is None


def test_completion_logprobs_in_the_legacy_shape(user):
    choice = complete(user, logprobs=2).json["choices"][0]
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == WORDS and logprobs["token_logprobs"] == [-0.5] * 5
    assert logprobs["top_logprobs"][0] == {"Hello ": -0.5, "alt1": -1.0}
    assert logprobs["text_offset"] == [0, 6, 11, 15, 24]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert complete(user).json["choices"][0]["logprobs"] is None


def test_completion_logprobs_zero_gives_the_sampled_token(user):
    logprobs = complete(user, logprobs=0).json["choices"][0]["logprobs"]
    assert logprobs["top_logprobs"] == [{w: -0.5} for w in WORDS]


def test_echo_puts_the_prompt_tokens_first_without_logprobs(user):
    choice = complete(user, logprobs=1, echo=True).json["choices"][0]
    logprobs = choice["logprobs"]
    assert choice["text"] == "Once upon" + "".join(WORDS)
    assert logprobs["tokens"] == ["Once ", "upon", *WORDS]
    assert logprobs["token_logprobs"][:2] == [None, None] and logprobs["top_logprobs"][:2] == [None, None]
    assert logprobs["text_offset"] == [0, 5, 9, 15, 20, 24, 33]
    assert logprobs["top_logprobs"][2] == {"Hello ": -0.5}


def test_completion_logprobs_streamed_and_replayed(user):
    headers = {"Idempotency-Key": "complete-logprobs"}
    plain = complete(user, logprobs=2, echo=True).json["choices"][0]["logprobs"]
    chunks = chunks_of(complete(user, headers=headers, logprobs=2, echo=True, stream=True))
    parts = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    joined = {name: [v for p in parts for v in p[name]] for name in plain}
    assert joined == plain
    # a completion is not stored: a retry of its key gets the final object
    replayed = complete(user, headers=headers, logprobs=2, echo=True, stream=True)
    assert replayed.headers.get("Idempotent-Replayed") == "true"
    assert replayed.json["choices"][0]["logprobs"] == plain


def test_many_prompts_each_with_their_logprobs(user):
    choices = complete(user, prompt=["a b", [5, 6]], logprobs=1, echo=True).json["choices"]
    assert [c["logprobs"]["tokens"][:2] for c in choices] == [["a ", "b"], ["<5>", "<6>"]]


@pytest.mark.parametrize("value", [6, -1, True, "2", 1.5])
def test_completion_logprobs_out_of_range(user, value):
    assert_error(complete(user, logprobs=value), 400, "invalid_request", param="logprobs")


def test_legacy_offsets_follow_characters_not_bytes():
    entries = [{"token": "\ufffd", "logprob": -1.0, "bytes": [0xC3]},
               {"token": "\ufffd", "logprob": -1.0, "bytes": [0xA9]},
               {"token": "!", "logprob": -1.0, "bytes": [33]}]
    assert legacy_logprobs(entries, [], "")["text_offset"] == [0, 0, 1]
    # a stream's chunks go on where the one before ended
    state = LegacyLogprobs()
    state.echoed([b" Hi"], "Hi")  # the tokenizer's leading space is not in the echoed text
    assert state.generated(entries[2:])["text_offset"] == [2]


def test_a_listed_completion_deleted_meanwhile_does_not_fail_the_list(user, store, monkeypatch):
    made = chat(user, store=True, logprobs=True).json

    def gone(response_id, client_id=None):
        raise NotFound(f"no response {response_id}")

    monkeypatch.setattr(store, "get_request", gone)
    page = user.get("/v1/chat/completions")
    assert page.status_code == 200, page.text
    assert [c["id"] for c in page.json["data"]] == [made["id"]]
