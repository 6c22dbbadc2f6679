"""From a stored request to the prompt: the messages a request makes, and the tokens
the engine's chat_prompt gives for them."""
from __future__ import annotations

from typing import Sequence

from lmsp.runtime.prompt import messages_for, render, render_request


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


def test_the_earlier_turns_come_after_the_instructions_and_before_the_input() -> None:
    request = {"instructions": "Be brief.", "input": "And now?",
               "context": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    assert messages_for(request) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                     {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "And now?"}]


def test_render_asks_the_engine_for_the_chat_prompt_with_the_assistant_turn_opened() -> None:
    engine = RecordingEngine()
    messages = [{"role": "user", "content": "hi"}]
    assert render(engine, messages) == [7, 8, 9]
    assert engine.calls == [(messages, True)]


class WordEngine:
    """One token per word of every message, in a context of ``n_ctx`` tokens."""

    def __init__(self, n_ctx: int) -> None:
        self.n_ctx = n_ctx

    def chat_prompt(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return [1 for m in messages for _ in m["content"].split()]


HISTORY = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two three four"},
           {"role": "assistant", "content": "five six seven eight"}, {"role": "user", "content": "nine ten"}]


def test_auto_truncation_drops_the_oldest_turns_until_the_output_fits() -> None:
    engine = WordEngine(n_ctx=16)
    # 12 tokens; room for 8 of output (at most half the context) leaves 8: the oldest turn goes
    assert len(render_request(engine, HISTORY, {"truncation": "auto"}, max_tokens=8)) == 8
    assert len(render_request(engine, HISTORY, {"truncation": "auto"}, max_tokens=100)) == 8  # half at most
    assert len(render_request(engine, HISTORY, {"truncation": "auto"}, max_tokens=4)) == 12  # it fits whole
    # two turns go: the system message and the last turn are left
    assert len(render_request(WordEngine(n_ctx=10), HISTORY, {"truncation": "auto"}, max_tokens=5)) == 4


class CountingWordEngine(WordEngine):
    renders = 0

    def chat_prompt(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        self.renders += 1
        return super().chat_prompt(messages, add_generation_prompt)


def test_auto_truncation_of_a_long_history_renders_a_logarithmic_number_of_prompts() -> None:
    from lmsp.runtime.prompt import truncated

    # 400 turns of 3 words and the system message: 1,202 tokens in a context of 64
    history = [{"role": "system", "content": "be brief"}]
    history += [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} words"} for i in range(400)]
    engine = CountingWordEngine(n_ctx=64)
    tokens, dropped = truncated(engine, history, {"truncation": "auto"}, max_tokens=32)
    # the fewest turns to drop for 32 tokens: 2 of the system message and 10 turns of 3
    assert (len(tokens), dropped) == (32, 390)
    assert engine.renders <= 2 + 9  # the whole prompt, the shortest, then halving 399 candidates
    engine = CountingWordEngine(n_ctx=64)  # the last turn alone does not fit: it is kept all the same
    tokens, dropped = truncated(engine, [*history[:-1], {"role": "user", "content": "x " * 60}], {"truncation": "auto"},
                                max_tokens=32)
    assert (len(tokens), dropped) == (62, 399)


def test_without_auto_truncation_the_prompt_is_whole_even_when_too_long() -> None:
    engine = WordEngine(n_ctx=8)
    for request in ({}, {"truncation": "disabled"}):
        assert len(render_request(engine, HISTORY, request, max_tokens=4)) == 12
    # the last turn is kept even when it does not fit: the context check refuses it then
    assert len(render_request(engine, HISTORY, {"truncation": "auto"}, max_tokens=8)) == 4
    assert len(render_request(WordEngine(4), HISTORY, {"truncation": "auto"}, max_tokens=8)) == 4


class RawEngine(RecordingEngine):
    """Also tokenizes: one id per character (BOS 1 when asked), and has FIM tokens or not."""

    n_vocab = 1000

    def __init__(self, fim: list[int] | None = None) -> None:
        super().__init__()
        self.info = {"fim_tokens": fim or []}
        self.tokenized: list[tuple[str, bool, bool]] = []

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        self.tokenized.append((text, add_special, parse_special))
        return ([1] if add_special else []) + [100 + ord(c) % 50 for c in text]


def test_a_completion_prompt_goes_without_the_chat_template() -> None:
    from lmsp.runtime.prompt import prompt_tokens

    engine = RawEngine()
    assert prompt_tokens(engine, {"prompt": "ab"}, 64) == [1, 100 + ord("a") % 50, 100 + ord("b") % 50]
    assert engine.tokenized == [("ab", True, True)] and engine.calls == []  # as llama-server tokenizes it
    assert prompt_tokens(engine, {"prompt": [5, 6]}, 64) == [5, 6]  # token ids as given
    assert prompt_tokens(engine, {"input": "hi"}, 64) == [7, 8, 9]  # a chat request: the template


def test_a_suffix_makes_the_fill_in_the_middle_prompt_or_is_refused() -> None:
    import pytest

    from lmsp.runtime.prompt import prompt_tokens

    engine = RawEngine(fim=[90, 91, 92])
    tokens = prompt_tokens(engine, {"prompt": "a", "suffix": "b"}, 64)
    assert tokens == [1, 90, 100 + ord("a") % 50, 91, 100 + ord("b") % 50, 92]
    with pytest.raises(ValueError, match="fill-in-the-middle"):
        prompt_tokens(RawEngine(), {"prompt": "a", "suffix": "b"}, 64)


def test_token_ids_outside_the_vocabulary_are_refused() -> None:
    import pytest

    from lmsp.runtime.prompt import prompt_tokens

    with pytest.raises(ValueError, match="token id 1000 is outside the vocabulary of 1000"):
        prompt_tokens(RawEngine(), {"prompt": [5, 1000]}, 64)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        prompt_tokens(RawEngine(), {"prompt": [-1]}, 64)


def test_truncation_counts_the_turns_it_drops_and_the_context_keeps_the_rest() -> None:
    from lmsp.runtime.prompt import seen_context, truncated

    engine = WordEngine(n_ctx=10)
    request = {"truncation": "auto", "instructions": "be brief", "input": "nine ten",
               "context": [{"role": "user", "content": "one two three four"}, {"role": "system", "content": "x"},
                           {"role": "assistant", "content": "five six seven eight"}]}
    tokens, dropped = truncated(engine, messages_for(request), request, max_tokens=5)
    assert (len(tokens), dropped) == (5, 2)
    seen = seen_context(request, dropped)
    assert seen == [{"role": "system", "content": "x"}]  # the system message stays
    assert render_request(engine, messages_for({**request, "context": seen}), request, 5) == tokens
    assert seen_context(request, 0) is None and truncated(engine, messages_for(request), {}, 5)[1] == 0
