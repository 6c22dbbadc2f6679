"""A conversation's KV file across a crash, on the real service, SmolLM2 and Gemma 3
(sliding-window layers of 512 tokens, a history longer than that, ``kv_swa_full =
on``): a first turn, SIGKILL, a restart, and a second turn whose prompt extends the
first one's loads the file (its ``cached_tokens`` cover the history) and answers as
a service without KV files (``kv_cache_bytes = 0``) does."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from e2e_helpers import Server

from lmsp import kv
from lmsp.models import pinned

pytestmark = pytest.mark.real_model

MODEL = "smollm2-135m-instruct"
INSTRUCTIONS = "You are a patient teacher. Answer in plain words and short sentences."
FIRST = "Tell me about rivers. " + "The river runs to the sea, and the sea is wide. " * 20
NEXT = ("Now say it again in one short sentence, for a child of six who has never seen the sea, "
        "and then tell me what a delta is, where rivers end, and why the sea is salty.")


GEMMA = "gemma-3-270m"
GEMMA_WINDOW = 512


def service(root: Path, model: str = MODEL, **env: str) -> Server:
    root.mkdir()
    return Server(root / "data", root, Path(model), {"LMSP_CACHE_DIR": str(pinned.default_cache()),
                                                     "LMSP_N_PARALLEL": "2", **env})


def ask(server: Server, token: str, messages: list[dict], model: str = MODEL) -> dict:
    response = server.call("POST", "/v1/responses", {"model": model, "instructions": INSTRUCTIONS, "input": messages,
                                                      "temperature": 0, "max_output_tokens": 16}, token=token)
    assert response["status"] in ("completed", "incomplete"), response  # incomplete: max_output_tokens
    return response


def text_of(response: dict) -> str:
    return "".join(part["text"] for item in response["output"] for part in item["content"])


def wait_for_file(kv_dir: Path, timeout: float = 30.0) -> kv.Entry:
    deadline = time.monotonic() + timeout
    while not kv.entries(kv_dir):
        assert time.monotonic() < deadline, f"no KV file in {kv_dir} after {timeout} s"
        time.sleep(0.1)
    (entry,) = kv.entries(kv_dir)
    return entry


@pytest.mark.parametrize(
    ("model", "first", "env"),
    [(MODEL, FIRST, {}), (GEMMA, FIRST * 3, {"LMSP_KV_SWA_FULL": "on"})],
    ids=["smollm2", "gemma3-swa-full"],
)
def test_the_next_turn_after_a_crash_loads_the_kv_file_and_answers_as_a_full_prefill(
    tmp_path, catalog_model, model, first, env
):
    catalog_model(model)  # in the cache the service reads
    server = service(tmp_path / "kv", model, **env)
    server.start(timeout=180)
    try:
        token = server.pair()
        history = [{"role": "user", "content": first}]
        answer = ask(server, token, history, model)
        entry = wait_for_file(server.data_dir / "kv")
        # the prompt's rows (tiled); past a sliding window, but its last tiled chunk
        held = answer["usage"]["input_tokens"] - (64 if model == GEMMA else 0)
        assert entry.n_tokens == held and (model != GEMMA or held > GEMMA_WINDOW)
        server.kill()
        server.start(timeout=180)
        turn = history + [{"role": "assistant", "content": text_of(answer)}, {"role": "user", "content": NEXT}]
        second = ask(server, token, turn, model)
        cached = second["usage"]["input_tokens_details"]["cached_tokens"]
        assert cached == entry.n_tokens  # the whole history's prompt, not prefilled again
        metrics = server.request("GET", "/metrics")[1]
        assert "lmsp_kv_file_hits_total 1" in metrics
    finally:
        server.stop(timeout=10)
    reference = service(tmp_path / "plain", model, LMSP_KV_CACHE_BYTES="0")
    reference.start(timeout=180)
    try:
        want = ask(reference, reference.pair(), turn, model)
    finally:
        reference.stop(timeout=10)
    assert want["usage"]["input_tokens_details"]["cached_tokens"] == 0
    assert text_of(second) == text_of(want)
    assert not (reference.data_dir / "kv").exists()
