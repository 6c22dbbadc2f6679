"""``truncation: "auto"`` on llama.cpp's chat layer: a history longer than the
context loses its oldest turns (a tool output with its call) until the prompt
leaves room for the output, and the task runs; ``disabled`` refuses it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from runtime_helpers import wait_finished

from lmsp.contracts import NewTask
from lmsp.models.demo import write_demo_model
from lmsp.errors import ContextLengthExceeded
from lmsp.runtime import chat_layer
from lmsp.runtime.truncation import budget

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chat_templates import TOOLS_TEMPLATE  # noqa: E402

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
    "additionalProperties": False}}  # fmt: skip


def turns(n: int) -> list[dict]:
    """``n`` turns of about 100 tokens each, each one calling a tool and reading its output."""
    out: list[dict] = []
    for i in range(n):
        out.append({"role": "user", "content": f"question {i} " + "word " * 100})
        out.append({"role": "assistant", "content": "", "call_id": f"call_{i}", "name": "get_weather",
                    "arguments": '{"city": "Paris"}'})  # fmt: skip
        out.append({"role": "user", "content": "", "call_id": f"call_{i}", "output": f"answer {i}"})
    return [*out, {"role": "user", "content": "And now?"}]


def request(truncation: str) -> dict:
    return {"model": "tools", "input": turns(40), "instructions": "Be brief.", "tools": [WEATHER],
            "tool_choice": "required", "truncation": truncation, "max_output_tokens": 40,
            "temperature": 0.0}  # fmt: skip


def new_task(body: dict) -> NewTask:
    return NewTask(client_id=None, model=body["model"], messages=[{"role": "user", "content": "Hi"}],
                   request=body, on_restart="fail", background=True, stream=False)  # fmt: skip


@pytest.fixture
def runtime(config, store, make_runtime):
    write_demo_model(config.models_dir / "tools.gguf", chat_template=TOOLS_TEMPLATE)
    rt = make_runtime(store)
    rt.register_model("tools.gguf")
    rt.load_model("tools")
    return rt


def text_of(engine, tokens: list[int]) -> str:
    return b"".join(engine.token_bytes(t) for t in tokens).decode()


def test_the_oldest_turns_go_until_the_output_fits(runtime, store):
    engine = runtime.registry.engine("tools")
    auto = request("auto")
    assert len(chat_layer.plan(engine, auto).tokens) > engine.n_ctx  # whole, it could not run
    tokens = chat_layer.truncated_tokens(engine, auto, 40)
    assert budget(engine.n_ctx, 40) - 120 < len(tokens) <= budget(engine.n_ctx, 40)  # a turn more would not fit
    prompt = text_of(engine, tokens)
    assert (
        "Be brief." in prompt
        and "question 0 " not in prompt
        and prompt.endswith("And now?<|im_end|>\n<|im_start|>assistant\n")
    )
    first = prompt.index("<|im_start|>", prompt.index("</tools>"))
    assert prompt[first:].startswith("<|im_start|>user\nquestion ")  # no output whose call went
    task_id = runtime.create_task(new_task(auto))["task"]["id"]
    assert wait_finished(runtime, store, task_id)["status"] == "completed"
    response = store.get_response(store.get_task(task_id)["response_id"])
    assert response["usage"]["input_tokens"] == len(tokens)
    assert [item["type"] for item in response["output"]] == ["function_call"]


def test_without_truncation_a_history_too_long_is_refused(runtime):
    for truncation in ("disabled", None):
        with pytest.raises(ContextLengthExceeded):
            runtime.create_task(new_task({**request("disabled"), "truncation": truncation}))
