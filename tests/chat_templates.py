"""Chat templates written for the chat layer's tests, in the styles llama.cpp's
chat layer recognises: ChatML turns with a ``<tool_call>`` block holding a
``{"name", "arguments"}`` object, and ChatML turns with a ``<think>`` block
switched by ``enable_thinking``; and :func:`template_engine`, an engine on a demo
model that carries one of them."""
from __future__ import annotations

from typing import Iterator

from lmsp.models.demo import write_demo_model
from lmsp.native import Engine

# ChatML; the tools are listed in the system turn, a call is a <tool_call> block
# with a JSON object, a tool's output a user turn in <tool_response>.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "Functions you may call:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    "To call one, answer:\n<tool_call>\n{\"name\": <name>, \"arguments\": <arguments>}\n</tool_call>"
    "<|im_end|>{{ '\\n' }}"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>{{ '\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' and loop.first %}"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content or '' }}"
    "{% for call in message.tool_calls or [] %}\n<tool_call>\n"
    "{\"name\": \"{{ call.function.name }}\", \"arguments\": {{ call.function.arguments | tojson }}}\n"
    "</tool_call>{% endfor %}<|im_end|>{{ '\\n' }}"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>{{ '\\n' }}"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>{{ '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# ChatML with a thinking block: an assistant turn shows its reasoning in
# <think>...</think>; the answer opens with <think>, or with an empty block when
# enable_thinking is false.
THINK_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if message.reasoning_content %}<think>\n{{ message.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ message.content }}<|im_end|>{{ '\\n' }}"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>{{ '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}"
    "{% endif %}"
)

# Both: the tools template whose assistant turns show their reasoning, and whose
# answer opens inside a thinking block (as THINK_TEMPLATE).
THINK_TOOLS_TEMPLATE = TOOLS_TEMPLATE.replace(
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n",
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if message.reasoning_content %}<think>\n{{ message.reasoning_content }}\n</think>\n\n{% endif %}",
).replace(
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}",
)
assert "reasoning_content" in THINK_TOOLS_TEMPLATE and THINK_TOOLS_TEMPLATE.count("<think>\n") == 3


def template_engine(tmp_path_factory, template: str) -> Iterator[Engine]:
    """An engine (one slot, 1,024 tokens) on a demo model whose chat template is
    ``template``, closed when the generator ends (a fixture's body)."""
    path = write_demo_model(tmp_path_factory.mktemp("m") / "m.gguf", chat_template=template)
    engine = Engine(str(path), n_ctx=1024, n_parallel=1, n_threads=1)
    yield engine
    engine.close()
