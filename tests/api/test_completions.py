"""Completions (B.11) with the scripted worker: the raw prompt checked and kept
for the engine (no chat template), the text_completion answer plain and
streamed, echo, and what is refused."""
from __future__ import annotations

import pytest
from api_helpers import assert_error, parse_sse

HELLO = "Hello from the scripted worker"


def complete(api, headers=None, **fields):
    body = {"model": "tiny", "prompt": "Once upon a time"}
    body.update(fields)
    return api.post("/v1/completions", json=body, headers=headers)


def test_plain_answers_a_text_completion(user, scripted, store):
    result = complete(user, max_tokens=8, temperature=0)
    assert result.status_code == 200, result.text
    body = result.json
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    assert choice == {"index": 0, "text": HELLO, "logprobs": None, "finish_reason": "stop"}
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    assert body["task"]["on_restart"] == "fail"
    assert scripted.checked == []  # no chat messages: the prompt goes as it is
    assert user.get("/v1/responses").json["data"] == []  # nothing kept past the answer


@pytest.mark.parametrize("prompt", ["plain text", ["one text"], [1, 2, 3], [[4, 5]]])
def test_the_prompt_is_kept_as_given(user, store, scripted, prompt):
    scripted.auto = False
    seen = []

    def run():
        for claim in scripted.start_all():
            seen.append(claim["request"])
            scripted.finish(claim["task_id"], "x")

    scripted.run_queued = run  # type: ignore[method-assign]
    assert complete(user, prompt=prompt).status_code == 200
    expected = prompt[0] if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) else prompt
    assert seen[0]["prompt"] == expected and "input" not in seen[0]


def test_echo_puts_the_prompt_in_front(user):
    assert complete(user, echo=True).json["choices"][0]["text"] == "Once upon a time" + HELLO
    assert complete(user, echo=True, prompt=[7, 8]).json["choices"][0]["text"] == "<7><8>" + HELLO
    frames = parse_sse(complete(user, echo=True, stream=True).text)
    text = "".join(f["data"]["choices"][0]["text"] for f in frames[:-1] if f["data"]["choices"])
    assert text == "Once upon a time" + HELLO


def test_stream_is_chunks_then_done(user):
    frames = parse_sse(complete(user, stream=True, stream_options={"include_usage": True}).text)
    assert frames[-1]["data"] == "[DONE]"
    chunks = [f["data"] for f in frames[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == HELLO
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 3


def test_idempotency_key_replays(user):
    headers = {"Idempotency-Key": "cmpl-1"}
    first = complete(user, headers=headers)
    again = complete(user, headers=headers)
    assert again.headers.get("Idempotent-Replayed") == "true" and again.json["id"] == first.json["id"]
    assert again.json["choices"] == first.json["choices"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ["a"] * 65}, "prompt"),
        ({"prompt": ["a", "b"], "stream": True}, "stream"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": [1, True]}, "prompt"),
        ({"prompt": {"text": "x"}}, "prompt"),
        ({"prompt": "a\u0000b"}, "prompt"),
        ({"prompt": [5000]}, "prompt"),  # outside the (scripted) vocabulary
        ({"prompt": [[]]}, "prompt[0]"),
        ({"prompt": ["a", [1, -2]]}, "prompt[1]"),
        ({"prompt": ["a", 7]}, "prompt[1]"),
        ({"n": 2}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"logprobs": 6}, "logprobs"),
        ({"presence_penalty": 1}, "presence_penalty"),
        ({"echo": True, "suffix": "end"}, "echo"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"messages": []}, "messages"),
    ],
)
def test_bad_requests_are_400_with_their_param(user, fields, param):
    assert_error(complete(user, **fields), 400, "invalid_request", param=param)


def test_an_empty_text_is_a_prompt_only_for_a_model_that_adds_bos(user, scripted):
    assert complete(user, prompt="").status_code == 200  # the scripted model's BOS: one token
    usual = scripted.prompt_pieces
    scripted.prompt_pieces = lambda model, prompt: [] if prompt == "" else usual(model, prompt)  # no BOS
    for prompt, param in (("", "prompt"), ([""], "prompt[0]"), (["a", ""], "prompt[1]")):
        assert_error(complete(user, prompt=prompt), 400, "invalid_request", param=param)
    assert_error(complete(user, prompt=[""], stream=True), 400, "invalid_request", param="prompt[0]")
    assert user.get("/v1/tasks").json["data"] == []  # refused before any task existed
    assert complete(user, prompt="", suffix="end").status_code == 200  # the suffix's tokens make a prompt


def test_many_prompts_are_a_choice_each(user, store):
    body = complete(user, prompt=["one", [1, 2], "three"], max_tokens=4).json
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert {c["text"] for c in body["choices"]} == {HELLO} and body["id"].startswith("cmpl-")
    assert body["usage"]["prompt_tokens"] == 9  # 3 each (the scripted worker's)
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    assert user.get("/v1/tasks").json["data"] == []  # each deleted once answered
    echoed = complete(user, prompt=["a", "b"], echo=True).json
    assert [c["text"] for c in echoed["choices"]] == ["a" + HELLO, "b" + HELLO]
    refused = complete(user, headers={"Idempotency-Key": "k"}, prompt=["a", "b"])
    assert_error(refused, 400, "invalid_request", param="Idempotency-Key")


def test_a_prompt_over_the_context_is_400(user):
    assert_error(complete(user, prompt="word " * 1200), 400, "context_length_exceeded")
    assert_error(complete(user, prompt=[1] * 1001), 400, "context_length_exceeded")
