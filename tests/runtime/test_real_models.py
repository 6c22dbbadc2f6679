"""Real models against llama-server: the prompt the service makes for a conversation
is llama-server's, token for token, and generation ends at the model's
end-of-generation tokens without printing special tokens.

llama-server's prompts are golden data (tests/runtime/data/prompt_golden.json),
recorded by bench/prompt_golden.py against llama-server built from the pinned
source; the command is at the top of the file.

The models come from ``lmsp.models.catalog.ensure_model`` where it is there, or else from
the files that LMSP_TEST_SMOLLM2 and LMSP_TEST_GEMMA name.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterator

import pytest
from runtime_helpers import submit, wait_finished

from lmsp.wire.responses import parse_create
from lmsp.config import Config
from lmsp.models.demo import write_demo_model
from lmsp.native import Engine
from lmsp.runtime.prompt import messages_for, render

GOLDEN = Path(__file__).resolve().parent / "data" / "prompt_golden.json"
SMOLLM2, GEMMA, DEMO = "smollm2-135m-instruct", "gemma-3-270m", "lmsp-demo-tiny"
ENV = {SMOLLM2: "LMSP_TEST_SMOLLM2", GEMMA: "LMSP_TEST_GEMMA"}
# text of SmolLM2's special tokens (ids 0-16, all control tokens); 0 and 2 end a generation
SPECIAL_TEXT = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<file_sep>")


def model_file(name: str) -> Path:
    """A real model's GGUF: from the catalog where the package has it, else from the environment."""
    try:
        from lmsp.models.catalog import ensure_model  # type: ignore[import-not-found]
    except ImportError:
        ensure_model = None
    if ensure_model is not None:
        try:
            return Path(ensure_model(name))
        except Exception as exc:  # no network, a bad download: say so
            pytest.fail(f"model {name} cannot be had from the catalog: {exc}")
    value = os.environ.get(ENV[name])
    if not value:
        pytest.fail(f"model {name} is needed: set {ENV[name]} to its GGUF file")
    path = Path(value)
    if not path.is_file():
        pytest.fail(f"{ENV[name]}={value} is not a file")
    return path


def golden() -> dict:
    return json.loads(GOLDEN.read_text())


def golden_cases() -> list:
    return [pytest.param(m["model"], case, id=f"{m['model']}/{case['name']}")
            for m in golden()["models"] for case in m["cases"]]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each model of the golden data, checked to be the file it was recorded on."""
    demo = write_demo_model(tmp_path_factory.mktemp("demo") / f"{DEMO}.gguf")
    paths = {DEMO: demo, SMOLLM2: model_file(SMOLLM2), GEMMA: model_file(GEMMA)}
    for record in golden()["models"]:
        if record["model"] == DEMO:
            continue  # written here; its bytes follow the gguf package, its prompts do not
        assert sha256_of(paths[record["model"]]) == record["sha256"], (
            f"{record['model']} is not the file the golden data was recorded on; "
            f"rerun: {golden()['command']}")
    return paths


@pytest.fixture(scope="module")
def engines(model_paths: dict[str, Path]) -> Iterator[dict[str, Engine]]:
    made = {name: Engine(str(path), n_ctx=1024, n_parallel=1, n_threads=1) for name, path in model_paths.items()}
    yield made
    for engine in made.values():
        engine.close()


@pytest.mark.parametrize("model,case", golden_cases())
def test_the_prompt_is_llama_servers(engines: dict[str, Engine], model: str, case: dict, tmp_path: Path) -> None:
    engine = engines[model]
    parsed = parse_create(dict(case["request"], model=model), Config(data_dir=tmp_path), lambda: 0)
    # the messages the request is checked with are the ones the run renders
    assert parsed.messages == messages_for(parsed.request)
    assert engine.apply_chat_template(parsed.messages) == case["prompt"]
    assert render(engine, parsed.messages) == case["tokens"]


def test_which_models_have_a_template(engines: dict[str, Engine]) -> None:
    for record in golden()["models"]:
        assert engines[record["model"]].info["has_chat_template"] is record["has_chat_template"]
    assert [m["model"] for m in golden()["models"] if not m["has_chat_template"]] == [GEMMA]


def generate(engine: Engine, prompt: list[int], max_tokens: int) -> tuple[str, list[int], str]:
    seq = engine.submit(prompt, max_tokens=max_tokens, temperature=0)
    tokens: list[int] = []
    text, finish = "", None
    while finish is None:
        engine.wait(60)
        for result in engine.poll():
            assert result["seq"] == seq
            tokens += result["tokens"]
            text += result["text"]
            finish = result["finish"] or finish
    return finish, tokens, text


def test_smollm2_stops_at_its_end_of_turn_token(engines: dict[str, Engine]) -> None:
    engine = engines[SMOLLM2]
    prompt = engine.chat_prompt([{"role": "user", "content": "What is 2+2?"}])
    finish, tokens, text = generate(engine, prompt, max_tokens=200)
    assert finish == "stop" and len(tokens) < 200  # no stop string was given: <|im_end|> ended it
    assert text.strip() and not any(t < 17 for t in tokens)
    assert not any(s in text for s in SPECIAL_TEXT)


@pytest.mark.parametrize("model,ids", [(SMOLLM2, range(17)), (GEMMA, (0, 1, 2, 105, 106))])
def test_special_tokens_are_not_text(engines: dict[str, Engine], model: str, ids) -> None:
    """Control tokens (BOS, EOS, turn markers) detokenize to nothing, one by one and in text."""
    engine = engines[model]
    for token in ids:
        assert engine.detokenize([token]) == ""
    word = engine.tokenize("word", add_special=False)
    assert engine.detokenize([*ids, *word, *ids]) == engine.detokenize(word)


def test_a_greedy_answer_of_the_service_completes_without_special_text(store, make_runtime, config) -> None:
    rt = make_runtime(store, config=config)
    rt.register_model(str(model_file(SMOLLM2)), "smollm2", confined=False)
    task = wait_finished(rt, store, submit(store, rt, "What is 2+2?", model="smollm2", max_output_tokens=200),
                         timeout=120)
    assert task["status"] == "completed"
    assert store.get_response(task["response_id"])["status"] == "completed"  # not incomplete: EOG ended it
    text = store.output_text(task["id"])
    assert text.strip() and not any(s in text for s in SPECIAL_TEXT)
