"""From a stored request to the prompt: the messages a request makes, and the tokens
the engine's chat_prompt gives for them."""
from __future__ import annotations

from typing import Sequence

from lmsp.runtime.prompt import messages_for, render


class RecordingEngine:
    """Stands for lmsp.native.Engine: records what it is asked to render."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[dict[str, str]], bool]] = []

    def chat_prompt(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        self.calls.append((list(messages), add_generation_prompt))
        return [7, 8, 9]


def test_instructions_come_first_as_a_system_message() -> None:
    request = {"instructions": "Be brief.", "input": [
        {"role": "developer", "content": "D"}, {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                                                            {"type": "input_text", "text": "b"}]},
        {"role": "assistant", "content": "A"}, "plain"]}
    assert messages_for(request) == [
        {"role": "system", "content": "Be brief."}, {"role": "system", "content": "D"},
        {"role": "user", "content": "ab"}, {"role": "assistant", "content": "A"}, {"role": "user", "content": "plain"}]


def test_empty_instructions_are_an_empty_system_message_and_absent_ones_none() -> None:
    assert messages_for({"instructions": "", "input": "hi"}) == [
        {"role": "system", "content": ""}, {"role": "user", "content": "hi"}]
    assert messages_for({"instructions": None, "input": "hi"}) == [{"role": "user", "content": "hi"}]
    assert messages_for({"input": "hi"}) == [{"role": "user", "content": "hi"}]


def test_render_asks_the_engine_for_the_chat_prompt_with_the_assistant_turn_opened() -> None:
    engine = RecordingEngine()
    messages = [{"role": "user", "content": "hi"}]
    assert render(engine, messages) == [7, 8, 9]
    assert engine.calls == [(messages, True)]
