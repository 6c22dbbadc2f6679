"""A sequence's KV out of the engine, into a KV file, and back into a new engine
(a restart) on SmolLM2: the next turn loads it instead of prefilling the
history and answers as a full prefill does, token for token; a damaged,
truncated, other model's or other instruction set's state is refused and the turn is
still right."""
from __future__ import annotations

from pathlib import Path

import pytest
from native_helpers import N_GPU_LAYERS, drain, generate

from lmsp import _native, cpu_check
from lmsp import kv
from lmsp.native import Engine, KvState

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(N_GPU_LAYERS != 0, reason="exactness needs the batch-invariant CPU backend"),
]

DIGEST = "sha256:" + "5a" * 32  # the tests name the model file themselves
HISTORY = [
    {"role": "system", "content": "You are a patient teacher. Answer in plain words and short sentences."},
    {"role": "user", "content": "Tell me about rivers. " + "The river runs to the sea, and the sea is wide. " * 20},
]

# 64 tokens or more with the answer: a prefill of the next turn ends with a whole tiled chunk
NEXT = ("Now say it again in one short sentence, for a child of six who has never seen the sea, "
        "and then tell me what a delta is, where rivers end, and why the sea is salty.")


@pytest.fixture
def make(smollm2_path: Path):
    made: list[Engine] = []

    def build(path: Path = smollm2_path, **kwargs) -> Engine:
        kwargs.setdefault("n_ctx", 2048)
        kwargs.setdefault("n_parallel", 2)
        kwargs.setdefault("n_threads", 1)
        engine = Engine(str(path), **kwargs)
        made.append(engine)
        return engine

    yield build
    for engine in made:
        engine.close()


def first_turn(engine: Engine, directory: Path) -> tuple[Path, list[int]]:
    """A turn whose KV goes to a file; the file and the next turn's prompt."""
    prompt = engine.chat_prompt(HISTORY)
    seq = engine.submit(prompt, max_tokens=16, temperature=0, persist=True)
    answer = generate_from(engine, seq)
    saved = engine.saved_prefix(seq)
    assert saved is not None and engine.saved_prefix(seq) is None  # once
    # the prompt's rows only: its answer was decoded one row at a time, a prefill computes it tiled
    assert saved["tokens"] == prompt and saved["tiled_rows"] == len(prompt) and saved["tiled_min"] == 64
    path, size = kv.write(directory, digest=DIGEST, kv_format=engine.info["kv_format"], cache_key="",
                               tokens=saved["tokens"], tiled_rows=saved["tiled_rows"],
                               tiled_min=saved["tiled_min"], state=saved["state"])
    assert size > len(saved["state"])
    turn = HISTORY + [{"role": "assistant", "content": answer},
                      {"role": "user", "content": NEXT}]
    return path, engine.chat_prompt(turn)


def generate_from(engine: Engine, seq: int) -> str:
    return drain(engine, [seq])[seq].text


def load(engine: Engine, path: Path, prompt: list[int]) -> dict:
    return kv.read(path, digest=DIGEST, kv_format=engine.info["kv_format"], cache_key="", tokens=prompt)


def test_a_kv_file_in_a_new_engine_answers_as_a_full_prefill(make, tmp_path: Path) -> None:
    first = make()
    path, prompt = first_turn(first, tmp_path)
    first.close()
    restarted = make()
    assert restarted.cached_prefix(prompt) == 0  # nothing in its slots
    prefix = load(restarted, path, prompt)
    n_held = len(prefix["tokens"])
    usable = restarted.usable_prefix(len(prompt), n_held, prefix["tiled_rows"], prefix["tiled_min"])
    assert usable == n_held  # the history, all of it: the new turn leaves a whole tiled chunk to prefill
    got = generate(restarted, prompt, max_tokens=24, temperature=0, prefix=prefix)
    assert got.last["n_cached"] == got.last["n_loaded"] == n_held
    assert not got.last["prefix_refused"]
    want = generate(make(prefix_cache=False), prompt, max_tokens=24, temperature=0)
    assert want.last["n_cached"] == 0
    assert got.tokens == want.tokens and got.text == want.text


def test_a_prefix_that_is_not_the_prompts_start_is_an_error(make, tmp_path: Path) -> None:
    engine = make()
    path, prompt = first_turn(engine, tmp_path)
    prefix = load(engine, path, prompt)
    with pytest.raises(ValueError, match="start of the prompt"):
        engine.submit(prompt[1:], max_tokens=4, prefix=prefix)


@pytest.mark.parametrize("damage", ["truncated", "other model", "shorter than it says"])
def test_a_state_the_engine_cannot_load_is_refused_and_the_turn_prefilled(make, tmp_path: Path, damage: str,
                                                                         catalog_model) -> None:
    engine = make()
    path, prompt = first_turn(engine, tmp_path)
    prefix = load(engine, path, prompt)
    if damage == "truncated":
        prefix["state"] = prefix["state"][: len(prefix["state"]) // 2]
    elif damage == "other model":  # Gemma's state of the same number of tokens
        gemma = make(catalog_model("gemma-3-270m"))
        tokens = gemma.tokenize("word " * len(prefix["tokens"]), add_special=False)[: len(prefix["tokens"])]
        seq = gemma.submit(tokens, max_tokens=1, temperature=0, persist=True)
        generate_from(gemma, seq)
        prefix["state"] = gemma.saved_prefix(seq)["state"]
    else:  # the state of fewer positions than its tokens
        seq = engine.submit(prompt[: len(prefix["tokens"]) - 70], max_tokens=1, temperature=0, persist=True)
        generate_from(engine, seq)
        prefix["state"] = engine.saved_prefix(seq)["state"]
    fresh = make()
    got = generate(fresh, prompt, max_tokens=24, temperature=0, prefix=prefix)
    assert got.last["prefix_refused"] and got.last["n_loaded"] == 0 and got.last["n_cached"] == 0
    want = generate(make(prefix_cache=False), prompt, max_tokens=24, temperature=0)
    assert got.tokens == want.tokens


def test_a_damaged_kv_file_fails_its_check(make, tmp_path: Path) -> None:
    engine = make()
    path, prompt = first_turn(engine, tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(kv.Refused, match="checksum"):
        load(engine, path, prompt)


GEMMA_HISTORY = [{"role": "user", "content": HISTORY[1]["content"] * 3}]  # past Gemma 3's window of 512


def gemma_turns(engine: Engine) -> tuple[int, list[int], list[int]]:
    """Gemma 3's first turn (a history longer than its sliding window) run to its end:
    its sequence, its prompt and the next turn's prompt."""
    prompt = engine.chat_prompt(GEMMA_HISTORY)
    assert len(prompt) > engine.info["n_swa"] == 512
    seq = engine.submit(prompt, max_tokens=16, temperature=0, persist=True)
    answer = generate_from(engine, seq)
    turn = GEMMA_HISTORY + [{"role": "assistant", "content": answer}, {"role": "user", "content": NEXT}]
    return seq, prompt, engine.chat_prompt(turn)


def test_past_a_sliding_window_a_kv_file_continues_as_a_full_prefill(make, catalog_model, tmp_path: Path) -> None:
    # llama.cpp writes the last window of the sliding-window layers only: enough to
    # continue from the state's end, which the slot holds with swa_full; the state
    # leaves the prompt's last tiled chunk out, so that a next prompt however short
    # continues from its end (a prefill leaves a whole tiled chunk to compute)
    gemma = make(catalog_model("gemma-3-270m"), swa_full=True)
    assert gemma.info["swa_full"]
    seq, prompt, next_prompt = gemma_turns(gemma)
    saved = gemma.saved_prefix(seq, into=bytearray())
    assert saved is not None and saved["tokens"] == prompt[: len(prompt) - 64] and saved["tiled_min"] == 64
    prompt = saved["tokens"]
    path, _ = kv.write(tmp_path, digest=DIGEST, kv_format=gemma.info["kv_format"], cache_key="",
                            tokens=saved["tokens"], tiled_rows=saved["tiled_rows"], tiled_min=saved["tiled_min"],
                            state=saved["state"])
    saved["state"].release()
    restarted = make(catalog_model("gemma-3-270m"), swa_full=False)  # the state fits either cache
    prefix = load(restarted, path, next_prompt)
    assert restarted.usable_prefix(len(next_prompt), len(prompt), prefix["tiled_rows"], prefix["tiled_min"]) == len(
        prompt)
    # cut shorter than it holds, its sliding-window layers would lack the window before the cut
    assert restarted.usable_prefix(len(prompt) - 1, len(prompt), prefix["tiled_rows"], prefix["tiled_min"]) == 0
    got = generate(restarted, next_prompt, max_tokens=24, temperature=0, prefix=prefix)
    assert got.last["n_loaded"] == len(prompt) and not got.last["prefix_refused"]
    want = generate(make(catalog_model("gemma-3-270m"), prefix_cache=False), next_prompt, max_tokens=24,
                    temperature=0)
    assert got.tokens == want.tokens


# llama.cpp's small sliding-window cache holds the window and one ubatch, padded to
# 256 cells: 768 with ubatches of 64. A 544-token prompt and this answer pass it by
# more than the 32 positions the prompt's end looks back past its window.
SMALL_UBATCH = 64
LONG_ANSWER = 290


@pytest.mark.parametrize("swa_full", [True, False])
def test_only_with_swa_full_a_slot_continues_a_history_after_a_long_answer(make, catalog_model, swa_full) -> None:
    # the small cache gives the positions before the prompt's end to the answer's last
    # ones: the slot can no longer be taken back to the prompt; the full cache can
    gemma = make(catalog_model("gemma-3-270m"), swa_full=swa_full, n_batch=SMALL_UBATCH, prefill_chunk=SMALL_UBATCH)
    history = [{"role": "user", "content": HISTORY[1]["content"] * 2 + " Now write a very long story."}]
    prompt = gemma.chat_prompt(history)
    assert len(prompt) > 512
    first = generate(gemma, prompt, max_tokens=LONG_ANSWER, temperature=0)
    assert len(first.tokens) == LONG_ANSWER
    turn = history + [{"role": "assistant", "content": first.text}, {"role": "user", "content": NEXT}]
    got = generate(gemma, gemma.chat_prompt(turn), max_tokens=2, temperature=0)
    assert got.last["n_cached"] == (len(prompt) if swa_full else 0)


def test_saved_states_fill_one_kept_buffer_and_load_from_a_view(make) -> None:
    engine = make()
    buffer = bytearray()
    views = []
    for question in ("Tell me about rivers.", "Tell me about the sea and its tides."):
        prompt = engine.chat_prompt([{"role": "user", "content": question}])
        seq = engine.submit(prompt, max_tokens=4, temperature=0, persist=True)
        generate_from(engine, seq)
        saved = engine.saved_prefix(seq, into=buffer)
        assert saved is not None and saved["state"].obj is buffer  # a view of the kept buffer, no new state
        with pytest.raises(BufferError):
            buffer.extend(b"x")  # not resized while a view of it lives
        views.append((saved["tokens"], bytes(saved["state"])))
        saved["state"].release()
    assert len(buffer) >= max(len(state) for _, state in views)
    tokens, state = views[-1]
    fresh = make()
    prompt = tokens + engine.tokenize(" And then?", add_special=False)
    got = generate(fresh, prompt, max_tokens=4, temperature=0,
                   prefix={"tokens": tokens, "state": memoryview(bytearray(state))})
    assert got.last["n_loaded"] > 0 and not got.last["prefix_refused"]


def test_a_state_copied_ahead_of_the_submission_is_handed_over_once(make, tmp_path: Path) -> None:
    # a KV file's state copied into the engine's memory before the submission (without
    # the GIL, off the runtime's lock): the submission takes it over without a copy
    engine = make()
    path, prompt = first_turn(engine, tmp_path)
    prefix = load(engine, path, prompt)
    state = KvState(prefix["state"])
    assert len(state) == len(prefix["state"])
    fresh = make()
    got = generate(fresh, prompt, max_tokens=24, temperature=0, prefix={**prefix, "state": state})
    assert len(state) == 0 and got.last["n_loaded"] == len(prefix["tokens"]) and not got.last["prefix_refused"]
    want = generate(make(prefix_cache=False), prompt, max_tokens=24, temperature=0)
    assert got.tokens == want.tokens
    with pytest.raises(ValueError, match="already"):
        fresh.submit(prompt, max_tokens=1, prefix={**prefix, "state": state})


def kernel_set(macros: list[str]) -> str:
    """The instruction set a build's ggml kernels use, from its target macros
    (lmsp.cpu_check's record of the build)."""
    have = set(macros)
    for name, needs in (("avx512vnni", {"__AVX512F__", "__AVX512VNNI__"}), ("avx512", {"__AVX512F__"}),
                        ("avxvnni", {"__AVX2__", "__AVXVNNI__"}), ("avx2", {"__AVX2__"}), ("avx", {"__AVX__"}),
                        ("neon-i8mm", {"__ARM_FEATURE_MATMUL_INT8"}), ("neon-dotprod", {"__ARM_FEATURE_DOTPROD"}),
                        ("neon", {"__ARM_NEON"})):
        if needs <= have:
            return name
    return "generic"


def test_a_kv_file_written_under_another_instruction_set_is_refused(make, tmp_path: Path) -> None:
    engine = make()
    path, prompt = first_turn(engine, tmp_path)
    record = cpu_check.build_record()
    assert record is not None
    here = engine.info["kv_format"]
    assert here.endswith(f"/isa-{kernel_set(record['macros'])}")
    # and how K-quant prompts are computed (tile_matmul.cpp)
    assert ("/kquants-vec-dot/" in here) is _native.TILE_MATMUL_KQUANTS_FIRST
    assert ("/kquants-ggml-tiled/" in here) is not _native.TILE_MATMUL_KQUANTS_FIRST
    assert load(engine, path, prompt)["tokens"]  # this build reads its own file
    for isa in ("avx2", "avx512vnni", "neon-dotprod"):
        other = here.rsplit("/isa-", 1)[0] + f"/isa-{isa}"
        if other != here:  # an engine of another kernel set: the file is not its KV
            with pytest.raises(kv.Refused):
                kv.read(path, digest=DIGEST, kv_format=other, cache_key="", tokens=prompt)
