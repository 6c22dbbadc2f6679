"""A thinking model's reasoning in Chat Completions' shape: ``message.reasoning_content``
and ``completion_tokens_details.reasoning_tokens``, and ``delta.reasoning_content``
in the chunks, as llama-server sends them."""
from __future__ import annotations

import json

from lmsp.api.openai_shapes import ChunkFraming, chat_completion

RESPONSE = {
    "id": "chatcmpl-1", "created_at": 1, "model": "think", "status": "completed", "seed": 1, "metadata": {},
    "error": None, "task": None,
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Hi.", "annotations": [], "logprobs": []}]},
    ],
    "usage": {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
              "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 8},
}  # fmt: skip


def test_a_completion_carries_the_reasoning_beside_the_answer():
    body = chat_completion(RESPONSE)
    message = body["choices"][0]["message"]
    assert message["content"] == "Hi." and message["reasoning_content"] == "hmm"
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 2
    assert body["choices"][0]["finish_reason"] == "stop"


def test_a_completion_without_reasoning_has_no_reasoning_content():
    plain = {**RESPONSE, "output": RESPONSE["output"][1:]}
    assert "reasoning_content" not in chat_completion(plain)["choices"][0]["message"]


def test_a_reasoning_delta_is_a_chunk_of_reasoning_content():
    framing = ChunkFraming("chat.completion", {"id": "chatcmpl-1", "created_at": 1, "model": "think"})
    frame = framing.event({"type": "response.reasoning.delta", "item_id": "rs_1", "output_index": 0,
                           "content_index": 0, "delta": "hm"})
    chunk = json.loads(frame[len(b"data: "):])
    assert chunk["choices"][0]["delta"] == {"reasoning_content": "hm"}
    assert framing.event({"type": "response.reasoning.done", "text": "hm"}) == b""


ENTRY = {"token": "Hi.", "logprob": -0.25, "bytes": [72, 105, 46], "top_logprobs": []}


def test_logprobs_are_the_message_s_after_the_reasoning():
    message = {**RESPONSE["output"][1], "content": [{**RESPONSE["output"][1]["content"][0], "logprobs": [ENTRY]}]}
    body = chat_completion({**RESPONSE, "output": [RESPONSE["output"][0], message]}, logprobs=True)
    assert body["choices"][0]["logprobs"] == {"content": [ENTRY], "refusal": None}
    framing = ChunkFraming("chat.completion", {"id": "chatcmpl-1", "created_at": 1, "model": "think"}, logprobs=True)
    assert json.loads(framing.event({"type": "response.reasoning.delta", "item_id": "rs_1", "output_index": 0,
                                     "content_index": 0, "delta": "hm"})[6:])["choices"][0]["logprobs"] is None
    frame = framing.event({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1,
                           "content_index": 0, "delta": "Hi.", "logprobs": [ENTRY]})
    assert json.loads(frame[6:])["choices"][0]["logprobs"] == {"content": [ENTRY], "refusal": None}
