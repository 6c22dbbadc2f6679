"""The clients of OpenAI's Chat Completions, Completions and Embeddings APIs,
unmodified, against the real service on real models: the ``openai`` package,
LangChain's ``ChatOpenAI`` and ``OpenAIEmbeddings``, LlamaIndex's
``OpenAILike`` and simonw's ``llm`` CLI. Each authenticates with a paired
client's token as its API key. SmolLM2 answers the chats; Gemma 3 270M, a
base model, the completions. Short greedy outputs only."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import openai
import pytest
from e2e_helpers import Server

from lmsp.models import pinned

pytestmark = pytest.mark.real_model

CHAT = "smollm2-135m-instruct"
BASE = "gemma-3-270m"
SYSTEM = "You are a helpful assistant."
QUESTION = "What is the capital of France?"
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path, catalog_model):
    root = tmp_path_factory.mktemp("clients")
    models = root / "data" / "models"
    models.mkdir(parents=True)
    gemma = catalog_model(BASE)
    try:
        os.link(gemma, models / f"{BASE}.gguf")
    except OSError:  # another file system
        shutil.copyfile(gemma, models / f"{BASE}.gguf")
    server = Server(root / "data", root, Path(CHAT), {"LMSP_CACHE_DIR": str(pinned.default_cache()),
                                                      "LMSP_N_PARALLEL": "2"})
    server.start(timeout=180)
    server.call("POST", "/v1/models", {"path": f"{BASE}.gguf"}, token=server.pair("models:write"), expect=201)
    yield server
    server.stop(timeout=10)


@pytest.fixture(scope="module")
def token(server) -> str:
    return server.pair()


@pytest.fixture(scope="module")
def client(server, token):
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=token, timeout=120.0, max_retries=0) as c:
        yield c


def test_openai_chat_plain_and_streamed_agree(client):
    plain = client.chat.completions.create(model=CHAT, messages=MESSAGES, temperature=0, max_tokens=16)
    assert plain.id.startswith("chatcmpl-") and plain.object == "chat.completion"
    choice = plain.choices[0]
    assert choice.message.content and choice.finish_reason == "stop"
    assert plain.usage.prompt_tokens > 0 and 0 < plain.usage.completion_tokens <= 16
    chunks = list(client.chat.completions.create(model=CHAT, messages=MESSAGES, temperature=0, max_tokens=16,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_openai_stored_chat_completions_are_retrieved_listed_and_deleted(client):
    made = [client.chat.completions.create(model=CHAT, messages=MESSAGES, temperature=0, max_tokens=4, store=True,
                                           metadata={"n": str(i)}) for i in range(3)]
    again = client.chat.completions.retrieve(made[0].id)
    assert again.choices[0].message.content == made[0].choices[0].message.content
    assert again.metadata == {"n": "0"}
    said = [(m.role, m.content) for m in client.chat.completions.messages.list(made[0].id)]
    assert said == [("system", SYSTEM), ("user", QUESTION)]
    listed = [c.id for c in client.chat.completions.list(limit=2)]  # every page, oldest first
    assert listed[-3:] == [c.id for c in made]
    deleted = client.chat.completions.delete(made[0].id)
    assert deleted.deleted and deleted.id == made[0].id
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(made[0].id)


def test_openai_chat_logprobs_plain_and_streamed(client):
    asked = {"model": CHAT, "messages": MESSAGES, "temperature": 0, "max_tokens": 8, "logprobs": True,
             "top_logprobs": 3}
    plain = client.chat.completions.create(**asked)
    content = plain.choices[0].logprobs.content
    assert b"".join(bytes(t.bytes) for t in content).decode("utf-8") == plain.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
    assert all(t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob for t in content)
    assert content[0].token == content[0].top_logprobs[0].token  # greedy: the likeliest token
    chunks = list(client.chat.completions.create(**asked, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.bytes) for t in streamed] == [(t.token, t.bytes) for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-3)


def test_openai_chat_completion_metadata_updated_and_filtered(client):
    made = client.chat.completions.create(model=CHAT, messages=MESSAGES, temperature=0, max_tokens=2, store=True,
                                          metadata={"run": "before"})
    updated = client.chat.completions.update(made.id, metadata={"run": "after"})
    assert updated.id == made.id and updated.metadata == {"run": "after"}
    assert [c.id for c in client.chat.completions.list(metadata={"run": "after"})] == [made.id]
    assert list(client.chat.completions.list(metadata={"run": "before"})) == []
    client.chat.completions.delete(made.id)


def test_openai_completions_logprobs_on_a_base_model(client):
    asked = {"model": BASE, "prompt": "The capital of France is", "temperature": 0, "max_tokens": 6, "logprobs": 2}
    plain = client.completions.create(**asked)
    logprobs = plain.choices[0].logprobs
    assert "".join(logprobs.tokens) == plain.choices[0].text
    assert len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == len(logprobs.text_offset)
    assert all(2 <= len(top) <= 3 and max(top.values()) <= 0 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)
    chunks = list(client.completions.create(**asked, stream=True))
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == logprobs.tokens


def test_openai_completions_on_a_base_model(client):
    plain = client.completions.create(model=BASE, prompt="The capital of France is", temperature=0, max_tokens=8)
    assert plain.id.startswith("cmpl-") and plain.object == "text_completion"
    assert plain.choices[0].text.strip() and plain.choices[0].finish_reason in ("stop", "length")
    streamed = client.completions.create(model=BASE, prompt="The capital of France is", temperature=0,
                                         max_tokens=8, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == plain.choices[0].text


def test_openai_completions_of_token_ids_with_echo(client, catalog_model):
    from lmsp.native import Engine

    with Engine(str(catalog_model(BASE)), n_ctx=64, n_parallel=1, n_threads=1) as engine:
        ids = engine.tokenize("The capital of France is", True, True)
    plain = client.completions.create(model=BASE, prompt="The capital of France is", temperature=0, max_tokens=8)
    echoed = client.completions.create(model=BASE, prompt=ids, temperature=0, max_tokens=8, echo=True)
    assert echoed.choices[0].text == "The capital of France is" + plain.choices[0].text


def test_openai_embeddings(client):
    # the package asks for base64 and decodes it
    result = client.embeddings.create(model=CHAT, input=["Paris is in France.", "The cat sleeps."])
    vectors = np.array([d.embedding for d in result.data])
    assert vectors.shape == (2, 576)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    floats = client.embeddings.create(model=CHAT, input="Paris is in France.", encoding_format="float")
    assert float(np.dot(floats.data[0].embedding, vectors[0])) > 0.9999
    assert result.usage.prompt_tokens > 0


def reference_answer(client) -> str:
    """The greedy answer of the ``openai`` package's request, on this machine: what every
    client library must get for the same messages."""
    made = client.chat.completions.create(model=CHAT, messages=MESSAGES, temperature=0, max_tokens=16)
    return made.choices[0].message.content


def test_langchain_chat_openai_invoke_and_stream(server, token, client):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=CHAT, base_url=f"{server.base_url}/v1", api_key=token, temperature=0, max_tokens=16,
                     max_retries=0)
    answer = llm.invoke([("system", SYSTEM), ("human", QUESTION)])
    assert answer.content == reference_answer(client)
    streamed = "".join(chunk.content for chunk in llm.stream([("system", SYSTEM), ("human", QUESTION)]))
    assert streamed == answer.content


def test_langchain_openai_completions_of_many_prompts(server, token, client):
    from langchain_openai import OpenAI

    llm = OpenAI(model=BASE, base_url=f"{server.base_url}/v1", api_key=token, temperature=0, max_tokens=6,
                 max_retries=0)
    prompts = ["The capital of France is", "Two plus two is"]
    result = llm.generate(prompts)  # one request for both
    texts = [g[0].text for g in result.generations]
    alone = [client.completions.create(model=BASE, prompt=p, temperature=0, max_tokens=6).choices[0].text
             for p in prompts]
    assert texts == alone and all(texts)


def test_langchain_openai_embeddings(server, token):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(model=CHAT, base_url=f"{server.base_url}/v1", api_key=token,
                                  check_embedding_ctx_length=False, max_retries=0)
    vectors = embeddings.embed_documents(["Paris is in France.", "The cat sleeps."])
    query = embeddings.embed_query("Paris is in France.")
    assert len(vectors) == 2 and len(query) == 576
    assert float(np.dot(query, vectors[0])) > 0.9999 > float(np.dot(query, vectors[1]))


def test_llama_index_openai_like_chat_and_stream(server, token, client):
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(model=CHAT, api_base=f"{server.base_url}/v1", api_key=token, is_chat_model=True,
                     temperature=0, max_tokens=16, max_retries=0)
    messages = [ChatMessage(role="system", content=SYSTEM), ChatMessage(role="user", content=QUESTION)]
    answer = llm.chat(messages)
    assert answer.message.content == reference_answer(client)
    deltas = "".join(part.delta or "" for part in llm.stream_chat(messages))
    assert deltas == answer.message.content


def test_llm_cli_with_the_service_in_its_extra_models(server, token, client, tmp_path):
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: lmsp-smollm2\n  model_name: {CHAT}\n  api_base: \"{server.base_url}/v1\"\n"
        "  api_key_name: lmsp\n")
    (tmp_path / "keys.json").write_text(f'{{"lmsp": "{token}"}}')
    result = subprocess.run(
        [sys.executable, "-m", "llm", "-m", "lmsp-smollm2", "-s", SYSTEM, "-o", "temperature", "0",
         "-o", "max_tokens", "16", QUESTION],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "LLM_USER_PATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == reference_answer(client).strip()


@pytest.mark.parametrize(
    ("path", "body", "status", "code", "param"),
    [
        ("/v1/chat/completions", {"model": CHAT, "messages": [{"role": "robot", "content": "x"}]}, 400,
         "invalid_request", "messages[0].role"),
        ("/v1/chat/completions", {"model": CHAT, "messages": [{"role": "tool", "content": "x"}]}, 400,
         "invalid_request", "messages[0].tool_call_id"),
        ("/v1/chat/completions", {"model": CHAT, "messages": MESSAGES, "n": 2}, 400, "invalid_request", "n"),
        ("/v1/chat/completions", {"model": CHAT, "messages": [{"role": "user", "content": "word " * 5000}]}, 400,
         "context_length_exceeded", "input"),
        ("/v1/completions", {"model": BASE, "prompt": [2, 10**9]}, 400, "invalid_request", "prompt"),
        ("/v1/completions", {"model": BASE, "prompt": "word " * 5000}, 400, "context_length_exceeded", "prompt"),
        ("/v1/completions", {"model": BASE, "prompt": "def f(", "suffix": "return x"}, 400, "invalid_request",
         "suffix"),
        ("/v1/embeddings", {"model": CHAT, "input": []}, 400, "invalid_request", "input"),
        ("/v1/embeddings", {"model": CHAT, "input": [[10**9]]}, 400, "invalid_request", "input"),
        ("/v1/embeddings", {"model": CHAT, "input": "word " * 5000}, 400, "context_length_exceeded", "input"),
        ("/v1/embeddings", {"model": CHAT, "input": "x", "dimensions": 8}, 400, "invalid_request", "dimensions"),
    ],
)
def test_bad_input_is_a_4xx_with_the_error_body(server, token, client, path, body, status, code, param):
    client.chat.completions.create(model=CHAT, messages=MESSAGES, max_tokens=1)  # both models loaded by now
    client.completions.create(model=BASE, prompt="x", max_tokens=1)
    got, payload = server.request("POST", path, body, token=token, timeout=120)
    assert (got, payload["error"]["code"], payload["error"]["param"]) == (status, code, param), payload
