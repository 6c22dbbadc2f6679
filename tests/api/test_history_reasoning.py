"""The model's earlier reasoning in a request: an assistant message's
``reasoning_content`` (Chat Completions, as llama-server takes it), a ``reasoning``
input item and a previous response's reasoning (Responses) are kept as reasoning
messages (lmsp.history) for a template that shows them; bad values are a 400."""
from __future__ import annotations

from api_helpers import assert_error

from lmsp import history
from lmsp.service.turns import _output_message

ASK = {"role": "user", "content": "Weather in Paris?"}
THOUGHT = {"type": "reasoning", "id": "rs_1", "summary": [],
           "content": [{"type": "reasoning_text", "text": "Paris is in France."}]}  # fmt: skip
SAID = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]}


def test_reasoning_content_is_kept_before_the_assistants_text(user, scripted):
    answer = {"role": "assistant", "content": "Sunny.", "reasoning_content": "Paris is in France."}
    made = user.post("/v1/chat/completions", json={"model": "tiny", "messages": [ASK, answer, ASK]})
    assert made.status_code == 200, made.text
    assert scripted.checked == [ASK, history.reasoning_message("Paris is in France."),
                                {"role": "assistant", "content": "Sunny."}, ASK]  # fmt: skip


def test_bad_reasoning_content_is_refused(user):
    for bad in (5, "a\x00b"):
        answer = {"role": "assistant", "content": "Sunny.", "reasoning_content": bad}
        made = user.post("/v1/chat/completions", json={"model": "tiny", "messages": [ASK, answer, ASK]})
        assert_error(made, 400, "invalid_request", "messages[1].reasoning_content")
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "x", "reasoning_content": "no"}
    made = user.post("/v1/chat/completions", json={"model": "tiny", "messages": [ASK, tool]})
    assert made.status_code == 400


def test_a_reasoning_item_is_kept_with_its_text_only(user, scripted):
    made = user.post("/v1/responses", json={"model": "tiny", "input": [ASK, THOUGHT, SAID, ASK]})
    assert made.status_code == 200, made.text
    assert scripted.checked == [ASK, history.reasoning_message("Paris is in France."),
                                {"role": "assistant", "content": "Sunny."}, ASK]  # fmt: skip
    summary_only = {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "short"}]}
    made = user.post("/v1/responses", json={"model": "tiny", "input": [ASK, summary_only, SAID, ASK]})
    assert made.status_code == 200
    assert scripted.checked == [ASK, {"role": "assistant", "content": "Sunny."}, ASK]
    alone = user.post("/v1/responses", json={"model": "tiny", "input": [THOUGHT]})
    assert_error(alone, 400, "invalid_request", "input")


def test_a_previous_responses_reasoning_is_kept_for_the_next_turn():
    assert _output_message({**THOUGHT, "status": "completed"}, {}) == history.reasoning_message("Paris is in France.")
    assert _output_message({"type": "reasoning", "id": "rs_2", "summary": []}, {}) is None
