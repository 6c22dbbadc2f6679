"""Where the engine puts new sequences among its slots. With a KV stream per
sequence, llama.cpp decodes each run of consecutive slots in a ubatch of its
own, one pass over the weights each (bench/ubatches.py measures what a pass
costs): sequences that come and go keep few runs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from lmsp.native import Engine

pytestmark = pytest.mark.real_model

WORDS = "river stone lantern orbit velvet copper meadow signal harbor quartz ember falcon prism tundra cobalt".split()


@pytest.mark.slow  # 48 answers of 128 tokens: about 40 s on two cores
def test_sixteen_sequences_at_a_time_on_64_slots_stay_packed(smollm2_path: Path) -> None:
    """Sixteen chat requests at a time on 64 slots, each replaced as it ends (the
    serving benchmark's load, prefix cache off): about one pass per step beyond
    what the prompts' own steps and the turnovers take. Freed slots taken in the
    order they were freed spread the sequences over every slot: 2.07 passes per
    step, against 1.22 with 16 slots."""
    engine = Engine(str(smollm2_path), n_ctx=512, n_parallel=64, n_threads=2, prefix_cache=False)

    def submit(i: int) -> None:
        words = " ".join(WORDS[(i * 7 + k * (i % 5 + 1)) % len(WORDS)] for k in range(24))
        prompt = engine.chat_prompt([{"role": "user", "content": words}])
        engine.submit(prompt, max_tokens=128, temperature=1.0, seed=i)

    try:
        before = engine.stats()
        for i in range(16):
            submit(i)
        ended, n = 0, 16
        while ended < 48:
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
