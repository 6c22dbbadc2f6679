"""Where the engine puts new sequences among its slots. With a KV stream per
sequence, llama.cpp decodes each run of consecutive slots in a ubatch of its
own, one pass over the weights each (bench/ubatches.py measures what a pass
costs): sequences that come and go keep few runs, and a free slot between
running ones takes a filler row that joins them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from native_helpers import FreeSlotRun, around_a_free_slot

from lmsp.native import Engine

WORDS = "river stone lantern orbit velvet copper meadow signal harbor quartz ember falcon prism tundra cobalt".split()


def test_sixteen_sequences_at_a_time_on_64_slots_stay_packed(demo_model_path: Path) -> None:
    """Sixteen chat requests at a time on 64 slots, each replaced as it ends
    (the serving benchmark's load, prefix cache off), 128 answers of 24 to 127
    tokens, so that freed slots are taken again: about one pass per step
    beyond what the prompts' own steps and the turnovers take (1.04). Freed
    slots taken in the order they were freed spread the sequences over every
    slot (1.89). The demo model: where a sequence goes depends on when
    sequences end, not on the weights."""
    engine = Engine(str(demo_model_path), n_ctx=512, n_parallel=64, n_threads=2, prefix_cache=False)

    def submit(i: int) -> None:
        words = " ".join(WORDS[(i * 7 + k * (i % 5 + 1)) % len(WORDS)] for k in range(24))
        prompt = engine.chat_prompt([{"role": "user", "content": words}])
        engine.submit(prompt, max_tokens=24 + (i * 37) % 104, temperature=1.0, seed=i)

    try:
        before = engine.stats()
        for i in range(16):
            submit(i)
        ended, n = 0, 16
        while ended < 128:
            for result in engine.poll():
                if result.get("finish"):
                    assert result["finish"] in ("length", "stop"), result
                    ended += 1
                    submit(n)
                    n += 1
            time.sleep(0.002)
        after = engine.stats()
    finally:
        engine.close()
    steps = after["steps"] - before["steps"]
    assert (after["ubatches"] - before["ubatches"]) / steps < 1.5, (steps, after["ubatches"] - before["ubatches"])


def chat_around_a_free_slot(path: Path, **options) -> FreeSlotRun:
    """Three chat prompts of 70 tokens or so (prefilled tiled), greedy, the
    middle one short: each alone, then the three at once in slots 0, 1 and 2
    (native_helpers.around_a_free_slot)."""
    made = [Engine(str(path), n_ctx=512, n_parallel=3, n_threads=1, **options) for _ in range(2)]
    ref, engine = made
    try:
        prompts = [
            ref.chat_prompt([{"role": "user", "content": " ".join(WORDS[i:] + WORDS[:i]) * 6}]) for i in range(3)
        ]
        assert all(len(p) >= 64 for p in prompts)
        return around_a_free_slot(ref, engine, prompts, [40, 6, 40])
    finally:
        for e in made:
            e.close()


@pytest.mark.real_model
def test_filler_rows_on_smollm2_change_no_token_and_no_kv(smollm2_path: Path) -> None:
    """A free slot between running ones takes a filler row, removed after each
    step (csrc/batch_plan.cpp): on a real model, with prompts prefilled tiled,
    the neighbours' tokens stay those of a run alone, and the free slot's KV
    stays what its sequence left."""
    run = chat_around_a_free_slot(smollm2_path)
    assert run.together == run.alone
    assert run.same_kv
    assert run.filler_rows >= 20


@pytest.mark.real_model
def test_filler_rows_on_a_sliding_window_model(catalog_model) -> None:
    """Gemma 3 (sliding-window layers, K-quant weights on the reference
    kernels): with a full-sized window cache (swa_full, the default) a free
    slot takes filler rows as on any model; with a small one, whose cells a
    new position may take from older ones, it takes none. The tokens are those
    of a run alone either way."""
    gemma = catalog_model("gemma-3-270m")
    run = chat_around_a_free_slot(gemma)
    assert run.together == run.alone
    assert run.same_kv
    assert run.filler_rows >= 20
    run = chat_around_a_free_slot(gemma, swa_full=False)
    assert run.together == run.alone
    assert run.same_kv
    assert run.filler_rows == 0
