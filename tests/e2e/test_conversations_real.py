"""Earlier turns on the real model (SmolLM2, greedy) through unmodified clients: the
``openai`` package continues a response (``previous_response_id``) and a conversation
(``conversations.create``, ``conversation=``), lists ``input_items`` and a
conversation's items, and runs the tool loop by ``previous_response_id``;
``openai-agents`` runs two turns chained by ``previous_response_id``."""
from __future__ import annotations

import asyncio
import json

import openai
import pytest
from test_real_model import INSTRUCTIONS, MODEL, smollm2_fixtures
from test_tool_clients import ASK, WEATHER_TOOL, get_weather

pytestmark = pytest.mark.real_model

# What the model answers depends on the CPU's arithmetic; what the service controls is
# the prompt. A turn that continues an earlier one must see exactly the prompt of the
# same history sent again in full: the same input tokens and, greedy on the same
# machine, the same answer.
INTRODUCE = "My name is Alice. Please remember it."
QUESTION = "What did I say my name was?"
GREEDY = {"model": MODEL, "temperature": 0, "max_output_tokens": 30}


server, token = smollm2_fixtures("turns")


def resent_history(first) -> list:
    """The input of a client that sends the whole history again: the first turn's
    input and output, then the question."""
    return [{"role": "user", "content": INTRODUCE}, *first.output, {"role": "user", "content": QUESTION}]


def assert_same_turn(client, turn, history: list) -> None:
    """``turn`` saw the prompt of ``history`` sent in full: the same input tokens and
    the same greedy answer."""
    resent = client.responses.create(input=history, **GREEDY)
    assert turn.usage.input_tokens == resent.usage.input_tokens
    assert turn.output_text == resent.output_text


@pytest.fixture
def client(server, token):
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=token, timeout=120.0, max_retries=0) as c:
        yield c


def test_previous_response_id_carries_the_first_turn(client):
    first = client.responses.create(input=INTRODUCE, **GREEDY)
    second = client.responses.create(input=QUESTION, previous_response_id=first.id, **GREEDY)
    assert second.previous_response_id == first.id
    # the prompt held the first turn: its input and its answer, then the question
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert_same_turn(client, second, resent_history(first))
    alone = client.responses.create(input=QUESTION, **GREEDY)
    assert alone.usage.input_tokens < second.usage.input_tokens - first.usage.output_tokens
    items = client.responses.input_items.list(second.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", QUESTION)]
    assert items.data[0].id.startswith("msg_")


def test_a_conversation_holds_the_turns(client):
    conversation = client.conversations.create(metadata={"topic": "names"})
    assert conversation.id.startswith("conv_") and conversation.metadata == {"topic": "names"}
    first = client.responses.create(input=INTRODUCE, conversation=conversation.id, **GREEDY)
    second = client.responses.create(input=QUESTION, conversation={"id": conversation.id}, **GREEDY)
    assert second.conversation.id == conversation.id
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert_same_turn(client, second, resent_history(first))
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant")] * 2
    assert items[1].id == first.output[0].id and items[3].content[0].text == second.output_text
    assert client.conversations.retrieve(conversation.id).id == conversation.id
    assert client.conversations.delete(conversation.id).deleted is True


def test_the_tool_loop_by_previous_response_id(client):
    first = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=ASK, tools=[WEATHER_TOOL],
                                    tool_choice="required", parallel_tool_calls=False, temperature=0,
                                    max_output_tokens=100)
    [call] = first.output
    assert call.type == "function_call"
    answer = get_weather(**json.loads(call.arguments))
    output = {"type": "function_call_output", "call_id": call.call_id, "output": answer}
    second = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=[output], tools=[WEATHER_TOOL],
                                     previous_response_id=first.id, tool_choice="none", temperature=0,
                                     max_output_tokens=60)
    assert second.output[0].type == "message" and second.output_text
    # the same prompt as the loop that sends the whole history again: the same greedy answer
    history = [{"role": "user", "content": ASK}, *first.output, output]
    resent = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=history, tools=[WEATHER_TOOL],
                                     tool_choice="none", temperature=0, max_output_tokens=60)
    assert second.usage.input_tokens == resent.usage.input_tokens
    assert second.output_text == resent.output_text


def test_openai_agents_chains_two_runs_by_previous_response_id(server, token):
    import agents
    agents.set_tracing_disabled(True)

    async def run() -> tuple[str, str, str]:
        async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=token, max_retries=0) as client:
            model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
            agent = agents.Agent(name="names", model=model,
                                 model_settings=agents.ModelSettings(temperature=0, max_tokens=30))
            first = await agents.Runner.run(agent, INTRODUCE)
            second = await agents.Runner.run(agent, QUESTION, previous_response_id=first.last_response_id)
            return first.last_response_id, second.last_response_id, second.final_output

    first_id, second_id, answer = asyncio.run(run())
    assert first_id and first_id.startswith("resp_")
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=token, max_retries=0) as client:
        second = client.responses.retrieve(second_id)
        assert second.previous_response_id == first_id and answer == second.output_text
        assert_same_turn(client, second, resent_history(client.responses.retrieve(first_id)))
