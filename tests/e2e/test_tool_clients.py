"""Real clients, unmodified, against the real model (SmolLM2) with function tools
and structured output: the ``openai`` package (a forced call, the tool loop by
resent history, streaming), ``openai-agents`` (an Agent with one function tool
and an output type, to its final typed output) and ``langchain-openai``
(``bind_tools`` and ``with_structured_output`` on the Responses API); then the
same through Chat Completions: the ``openai`` package (a forced call plain and
streamed, the tool loop by resent messages, ``chat.completions.parse`` with a
Pydantic model) and ``ChatOpenAI`` on its default Chat Completions. Each
reaches the service with a paired client's token as its API key."""
from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from test_real_model import INSTRUCTIONS, MODEL, smollm2_fixtures

pytestmark = pytest.mark.real_model

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
ASK = "What is the weather like in Paris today?"


class Weather(BaseModel):
    city: str = Field(max_length=30)
    summary: str = Field(max_length=60)  # a small model may repeat itself: its answer fits the cap


server, token = smollm2_fixtures("clients")


@pytest.fixture
def client(server, token):
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=token, timeout=60.0, max_retries=0) as c:
        yield c


def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"Sunny and 24 degrees in {city}."


def test_openai_forced_call_and_the_tool_loop(client):
    first = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=ASK, tools=[WEATHER_TOOL],
                                    tool_choice="required", temperature=0, max_output_tokens=100,
                                    parallel_tool_calls=False)
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    args = json.loads(call.arguments)
    history = [{"role": "user", "content": ASK}, *first.output,
               {"type": "function_call_output", "call_id": call.call_id, "output": get_weather(**args)}]
    second = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=history, tools=[WEATHER_TOOL],
                                     tool_choice="none", temperature=0, max_output_tokens=60)
    assert second.output[0].type == "message" and second.output_text


def test_openai_streamed_call(client):
    stream = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=ASK, tools=[WEATHER_TOOL],
                                     tool_choice="required", temperature=0, max_output_tokens=100, stream=True,
                                     parallel_tool_calls=False)
    events = list(stream)
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == done.arguments and json.loads(deltas)["city"]
    [call] = events[-1].response.output
    assert call.type == "function_call" and call.arguments == deltas


def test_openai_agents_agent_with_a_tool_and_an_output_type(server, token):
    import agents
    agents.set_tracing_disabled(True)

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=token, max_retries=0) as client:
            model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
            agent = agents.Agent(name="weather", instructions=INSTRUCTIONS, tools=[agents.function_tool(get_weather)],
                                 output_type=Weather, model=model,
                                 # once it has called the tool, this small model calls it again at every
                                 # turn (greedy, and most seeds): this seed answers in the output type at once
                                 model_settings=agents.ModelSettings(temperature=1.0, max_tokens=120,
                                                                     extra_body={"seed": 7}))
            return await agents.Runner.run(agent, ASK, max_turns=4)

    result = asyncio.run(run())
    assert isinstance(result.final_output, Weather) and result.final_output.city


def test_langchain_bind_tools_and_structured_output(server, token):
    import langchain_openai
    with httpx.Client(timeout=60.0) as http:
        llm = langchain_openai.ChatOpenAI(model=MODEL, base_url=f"{server.base_url}/v1", api_key=token,
                                          use_responses_api=True, temperature=0, max_tokens=120, max_retries=0,
                                          http_client=http)
        message = llm.bind_tools([get_weather], tool_choice="required").invoke(ASK)
        [call] = message.tool_calls
        assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
        weather = llm.with_structured_output(Weather).invoke("Describe the weather in Paris.")
    assert isinstance(weather, Weather)


# -- the same through Chat Completions ------------------------------------------------------

CHAT_TOOL = {"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}
CHAT_ASK = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": ASK}]


def test_chat_forced_call_and_the_tool_loop(client):
    first = client.chat.completions.create(model=MODEL, messages=CHAT_ASK, tools=[CHAT_TOOL], tool_choice="required",
                                           temperature=0, max_tokens=100, parallel_tool_calls=False)
    [choice] = first.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    history = [*CHAT_ASK, choice.message, {"role": "tool", "tool_call_id": call.id, "content": get_weather(**args)}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=[CHAT_TOOL], tool_choice="none",
                                            temperature=0, max_tokens=60)
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls


def test_chat_streamed_call(client):
    stream = client.chat.completions.create(model=MODEL, messages=CHAT_ASK, tools=[CHAT_TOOL],
                                            tool_choice="required", temperature=0, max_tokens=100, stream=True,
                                            parallel_tool_calls=False)
    chunks = [c for c in stream if c.choices]
    calls = [d for c in chunks for d in c.choices[0].delta.tool_calls or ()]
    [opened] = [d for d in calls if d.id]
    assert opened.index == 0 and opened.function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in calls)
    assert json.loads(arguments)["city"] and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks)


def test_chat_parse_with_a_pydantic_model(client):
    result = client.chat.completions.parse(model=MODEL, messages=[
        {"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": "Describe the weather in Paris."}],
        response_format=Weather, temperature=0, max_tokens=120)
    assert isinstance(result.choices[0].message.parsed, Weather)


@pytest.mark.parametrize(("fields", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {
        "type": "object", "properties": {"a": {"not": {"type": "string"}}}}}}},
     "response_format.json_schema.schema.properties.a.not"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "format": "email"}}}}}]},
     "tools[0].function.parameters.properties.a.format"),
])
def test_chat_a_schema_the_grammar_cannot_hold_is_a_400_naming_it(client, fields, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=CHAT_ASK, max_tokens=10, **fields)
    assert caught.value.status_code == 400 and caught.value.body["param"] == param


def test_langchain_chat_completions_bind_tools_and_structured_output(server, token):
    import langchain_openai
    with httpx.Client(timeout=60.0) as http:
        llm = langchain_openai.ChatOpenAI(model=MODEL, base_url=f"{server.base_url}/v1", api_key=token,
                                          temperature=0, max_tokens=120, max_retries=0, http_client=http)
        message = llm.bind_tools([get_weather], tool_choice="required").invoke(ASK)
        assert message.response_metadata["id"].startswith("chatcmpl-")  # Chat Completions, not Responses
        [call] = message.tool_calls
        assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
        weather = llm.with_structured_output(Weather).invoke("Describe the weather in Paris.")
    assert isinstance(weather, Weather)


# -- parallel calls -------------------------------------------------------------------------

TWO_ASK = [{"role": "system", "content": INSTRUCTIONS},
           {"role": "user", "content": "What is the weather like in Paris and in Rome today?"}]


def assert_valid_calls(made) -> None:
    assert made and len({c.id for c in made}) == len(made)
    for call in made:
        assert call.type == "function" and call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["parameters"])


def test_chat_parallel_calls_are_valid_calls_each_with_its_id(client):
    plain = client.chat.completions.create(model=MODEL, messages=TWO_ASK, tools=[CHAT_TOOL], tool_choice="required",
                                           temperature=0, max_tokens=200)
    assert plain.choices[0].finish_reason == "tool_calls" and plain.choices[0].message.content is None
    assert_valid_calls(plain.choices[0].message.tool_calls)
    with client.chat.completions.stream(model=MODEL, messages=TWO_ASK, tools=[CHAT_TOOL], tool_choice="required",
                                        temperature=0, max_tokens=200) as stream:
        streamed = stream.get_final_completion().choices[0].message
    assert streamed.content is None  # the role chunk's null content, accumulated as OpenAI's
    assert [c.function.arguments for c in streamed.tool_calls] == [
        c.function.arguments for c in plain.choices[0].message.tool_calls]
    one = client.chat.completions.create(model=MODEL, messages=TWO_ASK, tools=[CHAT_TOOL], tool_choice="required",
                                         temperature=0, max_tokens=200, parallel_tool_calls=False)
    assert len(one.choices[0].message.tool_calls) == 1
    assert_valid_calls(one.choices[0].message.tool_calls)


def test_responses_parallel_calls_are_items_each_with_its_ids(client):
    ask = TWO_ASK[1]["content"]
    made = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=ask, tools=[WEATHER_TOOL],
                                   tool_choice="required", temperature=0, max_output_tokens=200)
    assert made.output and all(i.type == "function_call" for i in made.output)
    assert len({i.call_id for i in made.output} | {i.id for i in made.output}) == 2 * len(made.output)
    for item in made.output:
        jsonschema.validate(json.loads(item.arguments), WEATHER_TOOL["parameters"])
    one = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=ask, tools=[WEATHER_TOOL],
                                  tool_choice="required", temperature=0, max_output_tokens=200,
                                  parallel_tool_calls=False)
    assert [i.type for i in one.output] == ["function_call"]
