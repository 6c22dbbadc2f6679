"""The model's own chat template, rendered by llama.cpp's Jinja engine, and the
prompt tokens made from it (Engine.apply_chat_template, Engine.chat_prompt).
The comparison with llama-server on real models is tests/runtime/test_real_models.py."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from lmsp.models.demo import write_demo_model
from lmsp.native import Engine, ModelFormatError

BOS = 1  # the demo vocabulary's <s>; it asks for a BOS at the start of a prompt

# as SmolLM2's template: a default system message where the chat has none
DEFAULT_SYSTEM = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nBe kind.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# writes the BOS itself, as many templates do
WITH_BOS = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
REFUSING = (
    "{% for m in messages %}{% if m['content'] == 'forbidden' %}"
    "{{ raise_exception('no such word here') }}{% endif %}{{ m['content'] }}{% endfor %}"
)
# a template that leaves system messages out: llama-server puts the system
# message at the start of the next one
NO_SYSTEM = ("{% for m in messages %}{% if m['role'] != 'system' %}"
             "<{{ m['role'] }}>{{ m['content'] }}\n{% endif %}{% endfor %}")


@pytest.fixture
def engine_with(tmp_path: Path) -> Iterator:
    """Engines on the demo model with a chat template of the test's choosing."""
    made: list[Engine] = []

    def make(template: str | None) -> Engine:
        path = write_demo_model(tmp_path / f"m{len(made)}.gguf", chat_template=template)
        e = Engine(str(path), n_ctx=256, n_parallel=1, n_threads=1)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def test_the_prompt_is_the_template_tokenized_with_special_tokens(engine: Engine) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = engine.apply_chat_template(messages)
    tokens = engine.chat_prompt(messages)
    assert engine.info["has_chat_template"] is True
    assert tokens == engine.tokenize(text, add_special=True, parse_special=True)
    assert tokens[0] == BOS and tokens.count(BOS) == 1
    assert engine.chat_prompt(messages, add_generation_prompt=False) == engine.tokenize(
        engine.apply_chat_template(messages, add_generation_prompt=False), add_special=True, parse_special=True)


def test_a_template_default_system_message_is_kept(engine_with) -> None:
    e = engine_with(DEFAULT_SYSTEM)
    assert e.apply_chat_template([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    # an empty system message takes its place
    assert e.apply_chat_template([{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_a_bos_the_template_writes_is_not_doubled(engine_with) -> None:
    e = engine_with(WITH_BOS)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    assert e.apply_chat_template(messages) == "[user] Hi\n[assistant] Yo\n"
    tokens = e.chat_prompt(messages)
    assert tokens[0] == BOS and tokens.count(BOS) == 1


def test_a_template_that_refuses_the_messages_is_a_value_error(engine_with) -> None:
    e = engine_with(REFUSING)
    assert e.apply_chat_template([{"role": "user", "content": "Hi"}]) == "Hi"
    with pytest.raises(ValueError, match="no such word here"):
        e.chat_prompt([{"role": "user", "content": "Hi"}, {"role": "user", "content": "forbidden"}])


def test_a_system_message_goes_into_the_next_one_where_the_template_has_no_system_role(engine_with) -> None:
    e = engine_with(NO_SYSTEM)
    assert e.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"},
                                  {"role": "assistant", "content": "Yo"}]) == "<user>S\nHi\n<assistant>Yo\n"


def test_a_template_that_does_not_parse_fails_the_load(tmp_path: Path) -> None:
    path = write_demo_model(tmp_path / "bad.gguf", chat_template="{% for m in messages %}{{ m['content'] }")
    with pytest.raises(ModelFormatError, match="chat template"):
        Engine(str(path), n_ctx=64, n_parallel=1, n_threads=1)


def test_a_model_without_template_gets_the_plain_format(engine_with) -> None:
    e = engine_with(None)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert e.info["has_chat_template"] is False
    assert e.info["chat_template"] is None
    text = "System: S\n\nUser: U\n\nAssistant:"
    assert e.apply_chat_template(messages) == text
    assert e.chat_prompt(messages) == e.tokenize(text, add_special=True, parse_special=True)
    assert e.chat_prompt(messages)[0] == BOS
