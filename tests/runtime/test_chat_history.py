"""Earlier turns as they reach the model's template: an assistant turn with several
calls is one turn, as the model made it, on the chat layer (``tool_calls``, then one
``tool`` message per call) and in the service's own format (one call per line, the
outputs in one user turn); Chat Completions' calls, tool messages and
``reasoning_content`` reach a template that knows tools as llama-server gives them
to it; the model's earlier reasoning goes where the template shows it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lmsp.wire.chat import parse_chat
from lmsp.wire.responses import parse_create
from lmsp.native import Engine
from lmsp.runtime import chat_layer
from lmsp.runtime import prompt as prompting

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chat_templates import THINK_TOOLS_TEMPLATE, template_engine  # noqa: E402

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather.",
                                         "parameters": PARAMETERS}}  # fmt: skip


class _Config:
    max_output_tokens = 16
    max_output_tokens_cap = 64
    default_on_restart = "fail"


def _call(i: int, city: str) -> dict:
    arguments = json.dumps({"city": city})
    return {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}


# a Chat Completions history: two parallel calls and their outputs, an answer, then a
# turn with reasoning, text and a call
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [_call(1, "Paris"), _call(2, "Rome")]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "Rain"},
    {"role": "assistant", "content": "Sunny in Paris, rain in Rome."},
    {"role": "user", "content": "And Oslo?"},
    {"role": "assistant", "content": "Let me look.", "reasoning_content": "Oslo is far north.",
     "tool_calls": [_call(3, "Oslo")]},
    {"role": "tool", "tool_call_id": "call_3", "content": "Snow"},
]  # fmt: skip


def _item_call(i: int, city: str) -> dict:
    return {"type": "function_call", "id": f"fc_{i}", "call_id": f"call_{i}", "name": "get_weather",
            "arguments": json.dumps({"city": city}), "status": "completed"}  # fmt: skip


def _output(i: int, text: str) -> dict:
    return {"type": "function_call_output", "call_id": f"call_{i}", "output": text}


# the same history as Responses input items
ITEMS = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    _item_call(1, "Paris"), _item_call(2, "Rome"), _output(1, "Sunny"), _output(2, "Rain"),
    {"type": "message", "role": "assistant",
     "content": [{"type": "output_text", "text": "Sunny in Paris, rain in Rome."}]},
    {"role": "user", "content": "And Oslo?"},
    {"type": "reasoning", "id": "rs_1", "summary": [],
     "content": [{"type": "reasoning_text", "text": "Oslo is far north."}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
    _item_call(3, "Oslo"), _output(3, "Snow"),
]  # fmt: skip

# what llama-server's /apply-template (--jinja) makes of MESSAGES and TOOL with
# TOOLS_TEMPLATE, as it answered at the pinned llama.cpp
SYSTEM = (
    "<|im_start|>system\nBe brief.\n\nFunctions you may call:\n<tools>\n"
    + json.dumps(TOOL)
    + '\n</tools>\nTo call one, answer:\n<tool_call>\n{"name": <name>, "arguments": <arguments>}\n'
    "</tool_call><|im_end|>\n"
)
CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)
LLAMA_SERVER_TOOLS = (
    SYSTEM + "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
    f"<|im_start|>assistant\n{CALLS}<|im_end|>\n"
    "<|im_start|>user\n<tool_response>\nSunny\n</tool_response><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\nRain\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nSunny in Paris, rain in Rome.<|im_end|>\n<|im_start|>user\nAnd Oslo?<|im_end|>\n"
    "<|im_start|>assistant\nLet me look."
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\nSnow\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
)
# the same with THINK_TOOLS_TEMPLATE: the reasoning shown in its assistant turn
LLAMA_SERVER_THINK = (
    LLAMA_SERVER_TOOLS.replace(
        "<|im_start|>assistant\nLet me look.",
        "<|im_start|>assistant\n<think>\nOslo is far north.\n</think>\n\nLet me look.",
    )
    + "<think>\n"
)


@pytest.fixture(scope="module")
def think_engine(tmp_path_factory):
    yield from template_engine(tmp_path_factory, THINK_TOOLS_TEMPLATE)




def chat_request(**body) -> dict:
    return parse_chat({"model": "m", "messages": MESSAGES, "tools": [TOOL], **body}, _Config(), lambda: 1).request


def items_request(**body) -> dict:
    flat = {"type": "function", **TOOL["function"]}
    given = {"model": "m", "input": ITEMS, "instructions": "Be brief.", "tools": [flat], **body}
    return parse_create(given, _Config(), lambda: 1).request


def tokens_of(engine: Engine, request: dict) -> list[int]:
    return prompting.prompt_tokens(engine, request, 16)


def as_llama_server(engine: Engine, prompt: str) -> list[int]:
    """The tokens llama-server feeds the model for ``prompt``."""
    return list(engine.tokenize(prompt, add_special=True, parse_special=True))


def text_of(engine: Engine, tokens: list[int]) -> str:
    return b"".join(engine.token_bytes(t) for t in tokens).decode()


def test_a_chat_completions_history_is_the_prompt_llama_server_makes(tools_engine):
    assert tokens_of(tools_engine, chat_request()) == as_llama_server(tools_engine, LLAMA_SERVER_TOOLS)


def test_a_history_with_calls_reaches_the_template_as_calls_without_tools_too(tools_engine):
    request = parse_chat({"model": "m", "messages": MESSAGES}, _Config(), lambda: 1).request
    without_tools = LLAMA_SERVER_TOOLS.replace(SYSTEM, "<|im_start|>system\nBe brief.<|im_end|>\n")
    assert tokens_of(tools_engine, request) == as_llama_server(tools_engine, without_tools)
    # with log probabilities too: the chat layer's message carries them
    logprobs = parse_chat({"model": "m", "messages": MESSAGES, "logprobs": True}, _Config(), lambda: 1).request
    assert tokens_of(tools_engine, logprobs) == as_llama_server(tools_engine, without_tools)


def test_parallel_calls_are_one_assistant_message_and_their_outputs_tool_messages():
    for request in (chat_request(), items_request()):
        messages = chat_layer.chat_messages(request)
        assert [m["role"] for m in messages] == [
            "system", "user", "assistant", "tool", "tool", "assistant", "user", "assistant", "tool"]  # fmt: skip
        assert [c["id"] for c in messages[2]["tool_calls"]] == ["call_1", "call_2"] and messages[2]["content"] == ""
        assert [m["tool_call_id"] for m in messages[3:5]] == ["call_1", "call_2"]
        assert [m["content"] for m in messages[3:5]] == ["Sunny", "Rain"]
        last_turn = messages[7]
        assert last_turn["content"] == "Let me look." and last_turn["tool_calls"][0]["id"] == "call_3"
        assert last_turn["reasoning_content"] == "Oslo is far north."


def test_response_items_make_the_same_prompt_as_the_chat_messages(tools_engine):
    assert tokens_of(tools_engine, items_request()) == as_llama_server(tools_engine, LLAMA_SERVER_TOOLS)


def test_reasoning_reaches_a_template_that_shows_it(think_engine):
    expected = as_llama_server(think_engine, LLAMA_SERVER_THINK)
    assert tokens_of(think_engine, chat_request()) == expected
    assert tokens_of(think_engine, items_request()) == expected


def test_reasoning_before_a_user_turn_is_dropped(think_engine):
    request = items_request(input=[ITEMS[7], {"role": "user", "content": "Hi"}])
    assert "reasoning_content" not in json.dumps(chat_layer.chat_messages(request))
    assert "far north" not in text_of(think_engine, tokens_of(think_engine, request))


CITIES = ("Paris", "Rome", "Oslo")


def test_the_services_own_format_has_parallel_calls_one_per_line(plain_engine):
    for request in (chat_request(), items_request()):
        prompt = text_of(plain_engine, tokens_of(plain_engine, request))
        paris, rome, oslo = (f'{{"name": "get_weather", "arguments": {{"city": "{c}"}}}}' for c in CITIES)
        both = f"{paris}\n{rome}"
        assert f"<|im_start|>assistant\n{both}<|im_end|>" in prompt
        outputs = "Result of get_weather (call call_1):\nSunny\n\nResult of get_weather (call call_2):\nRain"
        assert f"<|im_start|>user\n{outputs}<|im_end|>" in prompt
        assert "far north" not in prompt  # no template without tools shows reasoning here
        assert f"<|im_start|>assistant\nLet me look.\n{oslo}<|im_end|>" in prompt  # the text and its call
        assert prompt.count("<|im_start|>assistant\n") == 4  # one per answer, and the one opened
