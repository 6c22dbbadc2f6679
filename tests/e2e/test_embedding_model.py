"""The catalog's embedding model end to end: ``lmsp serve --model all-minilm-l6-v2``
(the sentence-transformers checkpoint converted to GGUF at pull) against an independent
numpy implementation of the model (tests/bert_reference.py) on 200 varied sentences,
its refusals, its limit of 512 tokens, a small retrieval set on which its recall is
compared with SmolLM2's mean-pooled vectors, and LangChain's ``OpenAIEmbeddings`` and
LlamaIndex's ``OpenAIEmbedding``, unmodified, with a paired client's token as API key."""
from __future__ import annotations

import base64
import sys
from pathlib import Path

import numpy as np
import pytest
from e2e_helpers import Server

from lmsp.models import catalog
from lmsp.models import pinned
from lmsp.native import Engine
from lmsp.runtime.embeddings import Embeddings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_reference import reference  # noqa: E402
from embedding_texts import PASSAGES, QUESTIONS, SENTENCES, recall_at  # noqa: E402

pytestmark = pytest.mark.real_model

MODEL = "all-minilm-l6-v2"
BATCH = 50


@pytest.fixture(scope="module")
def minilm_path(catalog_model) -> Path:
    return catalog_model(MODEL)


@pytest.fixture(scope="module")
def expected(request, tmp_path_factory, minilm_path) -> tuple[list[list[int]], np.ndarray]:
    """The reference's token ids and vectors of SENTENCES, from the checkpoint's own files
    (kept in pytest's cache: the x86-64-v3 tier reads what the suite computed)."""
    root = tmp_path_factory.mktemp("minilm-reference")
    folder = catalog.checkpoint(MODEL, root / "checkpoint")
    return reference(folder, SENTENCES, root, cache=request.config.cache.mkdir("bert-reference"))


@pytest.fixture(scope="module")
def server(tmp_path_factory, minilm_path):
    root = tmp_path_factory.mktemp("minilm")
    served = Server(root / "data", root, Path(MODEL), {"LMSP_CACHE_DIR": str(pinned.default_cache()),
                                                       "LMSP_N_PARALLEL": "1"})
    served.start(timeout=180)
    yield served
    served.stop(timeout=10)


@pytest.fixture(scope="module")
def token(server) -> str:
    return server.pair()


def embed(server, token, texts, **fields) -> tuple[np.ndarray, int]:
    """The service's vectors of ``texts`` (in batches) and the prompt tokens it counted."""
    rows, tokens = [], 0
    for start in range(0, len(texts), BATCH):
        out = server.call("POST", "/v1/embeddings", {"model": MODEL, "input": texts[start:start + BATCH], **fields},
                          token=token, timeout=300)
        rows += [item["embedding"] for item in sorted(out["data"], key=lambda d: d["index"])]
        tokens += out["usage"]["prompt_tokens"]
    return np.array(rows, dtype=np.float64), tokens


def test_the_pull_converts_the_checkpoint_to_the_pinned_file(minilm_path, server, token):
    model = catalog.lookup(MODEL)
    assert pinned.sha256_of(minilm_path) == model.sha256 and minilm_path.stat().st_size == model.size
    shown = server.call("GET", f"/v1/models/{MODEL}", token=token)
    assert shown["digest"] == f"sha256:{model.sha256}"
    assert (shown["architecture"], shown["quantization"], shown["context_length"]) == ("bert", "F16", 512)
    assert shown["capabilities"] == ["embeddings"]


def test_token_ids_equal_the_reference_tokenizer_s(minilm_path, expected, server, token):
    ids, _ = expected
    with Engine(str(minilm_path), n_ctx=512, n_parallel=1, n_threads=1) as engine:
        assert [Embeddings._tokens(engine, s, i) for i, s in enumerate(SENTENCES)] == ids  # the service's tokens
    # the service's vectors of the texts are those of the reference's token ids, bit for bit
    texts, counted = embed(server, token, SENTENCES)
    from_ids, _ = embed(server, token, ids)
    assert counted == sum(len(t) for t in ids) and np.array_equal(texts, from_ids)


def test_the_service_s_vectors_are_the_reference_s(expected, server, token, record_property):
    _, vectors = expected
    got, _ = embed(server, token, SENTENCES)
    assert got.shape == (200, 384)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cosines = np.sum(got * vectors, axis=1)
    record_property("min_cosine", float(cosines.min()))
    assert cosines.min() >= 0.9999, (float(cosines.min()), SENTENCES[int(cosines.argmin())])


def test_dimensions_and_base64_as_for_other_models(server, token):
    plain, _ = embed(server, token, ["The cat sat on the mat."])
    same, _ = embed(server, token, ["The cat sat on the mat."], dimensions=384)
    assert np.array_equal(plain, same)
    out = server.call("POST", "/v1/embeddings", {"model": MODEL, "input": "The cat sat on the mat.",
                                                 "encoding_format": "base64"}, token=token)
    decoded = np.frombuffer(base64.b64decode(out["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(decoded, plain[0].astype(np.float32))
    status, body = server.request("POST", "/v1/embeddings", {"model": MODEL, "input": "x", "dimensions": 128},
                                  token=token)
    assert status == 400 and body["error"]["param"] == "dimensions"


@pytest.mark.parametrize("path,body", [
    ("/v1/responses", {"input": "Hello"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}]}),
    ("/v1/completions", {"prompt": "Hello"}),
])
def test_generation_is_refused_with_model_not_generative(server, token, path, body):
    before = server.call("GET", "/v1/tasks?limit=100", token=token)["data"]
    status, answer = server.request("POST", path, {"model": MODEL, **body}, token=token)
    assert status == 400, answer
    assert (answer["error"]["code"], answer["error"]["param"]) == ("model_not_generative", "model")
    assert server.call("GET", "/v1/tasks?limit=100", token=token)["data"] == before


def test_an_input_over_512_tokens_is_refused_naming_it(server, token):
    fits = "word " * 510  # [CLS] + 510 + [SEP]
    embed(server, token, [fits])
    status, answer = server.request("POST", "/v1/embeddings", {"model": MODEL, "input": ["short", fits + "word"]},
                                    token=token)
    assert status == 400, answer
    assert answer["error"]["code"] == "context_length_exceeded" and answer["error"]["param"] == "input[1]"
    assert "513 tokens" in answer["error"]["message"] and "512" in answer["error"]["message"]


def test_retrieval_recall_is_far_above_smollm2_s(server, token, smollm2_path, record_property, capsys):
    questions, _ = embed(server, token, QUESTIONS)
    passages, _ = embed(server, token, PASSAGES)
    minilm = recall_at(5, questions, passages)
    with Engine(str(smollm2_path), n_ctx=512, n_parallel=1, n_threads=1) as engine:
        def vectors(texts):
            return engine.embed([engine.tokenize(t, add_special=True, parse_special=True) for t in texts])

        smollm2 = recall_at(5, vectors(QUESTIONS), vectors(PASSAGES))
    record_property("recall_at_5", {"all-minilm-l6-v2": minilm, "smollm2-135m-instruct": smollm2})
    with capsys.disabled():
        print(f"\nrecall@5 on {len(QUESTIONS)} questions, {len(PASSAGES)} passages: "
              f"{MODEL} {minilm:.2f}, smollm2-135m-instruct (mean-pooled) {smollm2:.2f}")
    assert minilm >= 0.9 and minilm >= smollm2 + 0.3


def test_langchain_openai_embeddings(server, token):
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: texts as they are (LangChain would otherwise send
    # the token ids of OpenAI's tokenizer, which are not this model's)
    client = OpenAIEmbeddings(model=MODEL, base_url=f"{server.base_url}/v1", api_key=token,
                              check_embedding_ctx_length=False, max_retries=0, chunk_size=16)
    documents = client.embed_documents(PASSAGES[:20])
    query = client.embed_query(QUESTIONS[0])
    expected, _ = embed(server, token, PASSAGES[:20] + QUESTIONS[:1])
    assert np.allclose(np.array(documents + [query]), expected, atol=1e-7)
    assert int(np.argmax(np.array(documents) @ np.array(query))) == 0  # the passage that answers it


def test_llama_index_openai_embedding(server, token):
    from llama_index.embeddings.openai import OpenAIEmbedding

    client = OpenAIEmbedding(model_name=MODEL, api_base=f"{server.base_url}/v1", api_key=token, max_retries=0,
                             embed_batch_size=16)
    documents = client.get_text_embedding_batch(PASSAGES[:20])
    query = client.get_query_embedding(QUESTIONS[0])
    expected, _ = embed(server, token, PASSAGES[:20] + QUESTIONS[:1])
    assert np.allclose(np.array(documents + [query]), expected, atol=1e-7)
    assert int(np.argmax(np.array(documents) @ np.array(query))) == 0
