"""Helpers of the native engine tests (no fixtures here: see conftest.py)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from lmsp.native import Engine

# GPU layers of the fixtures' engines (conftest.py): 0, or 99 to run them on a GPU
N_GPU_LAYERS = int(os.environ.get("LMSP_TEST_N_GPU_LAYERS", "0"))
# the catalog models of the exactness tests, and how they sample: greedy, and
# with every sampler on
CATALOG_MODELS = ["smollm2-135m-instruct", "gemma-3-270m"]
SAMPLING_CASES = {
    "greedy": dict(temperature=0),
    "sampled": dict(temperature=0.9, top_k=40, top_p=0.95, seed=11),
}


@dataclass
class Run:
    """Everything poll() gave for one sequence."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # when submitted with logprobs=True
    text: str = ""
    finish: str | None = None
    results: list[dict] = field(default_factory=list)

    @property
    def last(self) -> dict:
        return self.results[-1]


def drain(engine: Engine, seqs: list[int]) -> dict[int, Run]:
    """Polls until every sequence in ``seqs`` has finished."""
    runs = {s: Run() for s in seqs}
    while any(r.finish is None for r in runs.values()):
        engine.wait(60)
        for res in engine.poll():
            run = runs[res["seq"]]
            assert run.finish is None, "a result after the finish"
            run.results.append(res)
            run.tokens += res["tokens"]
            run.logprobs += res.get("logprobs", [])
            run.text += res["text"]
            run.finish = res["finish"]
    return runs


def take(engine: Engine, at_least: int) -> Run:
    """Polls the one running sequence until at least ``at_least`` tokens came out."""
    run = Run()
    while len(run.tokens) < at_least:
        engine.wait(60)
        for res in engine.poll():
            run.results.append(res)
            run.tokens += res["tokens"]
            run.logprobs += res.get("logprobs", [])
            run.text += res["text"]
    return run


class Watch:
    """Counts, per sequence, the tokens poll() gave and whether it finished,
    while a test polls until a condition of its own holds."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.tokens: dict[int, int] = {}
        self.got: dict[int, list[int]] = {}  # the tokens themselves
        self.ended: set[int] = set()

    def until(self, done) -> None:
        while not done():
            self.engine.wait(60)
            for res in self.engine.poll():
                self.tokens[res["seq"]] = self.tokens.get(res["seq"], 0) + len(res["tokens"])
                self.got.setdefault(res["seq"], []).extend(res["tokens"])
                if res["finish"] is not None:
                    self.ended.add(res["seq"])


def generate(engine: Engine, prompt: list[int], **kwargs) -> Run:
    seq = engine.submit(prompt, **kwargs)
    return drain(engine, [seq])[seq]


def prompt_tokens(engine: Engine, text: str) -> list[int]:
    return engine.tokenize(text, add_special=True)


def random_prompt(seed: int, n: int) -> list[int]:
    """BOS, then ordinary pieces of the SPM vocabulary (byte tokens included)."""
    return [1] + np.random.default_rng(seed).integers(3, 32000, size=n - 1).tolist()


@dataclass
class FreeSlotRun:
    """Three greedy sequences, each alone on one engine, then together in slots
    0, 1 and 2 of another, the middle one ending first (around_a_free_slot)."""
    alone: list[list[int]]
    together: list[list[int]]
    same_kv: bool  # slot 1 kept exactly the KV its sequence left alone (a persisted sequence's saved state)
    filler_rows: int  # over the run together
    # steps, filler_rows, ubatches and finished (sequences), from slot 1's end to the window's (around_a_free_slot)
    window: dict[str, int]


def around_a_free_slot(ref: Engine, engine: Engine, prompts: list[list[int]], lengths: list[int],
                       window_tokens: int | None = None) -> FreeSlotRun:
    """The window ends once this thread has seen `window_tokens` of slot 0's
    tokens (by default all of them), or an end of slot 0 or 2: where that is
    well before their ends, a thread that sees the engine's results late still
    ends it while both run."""
    alone, alone_saved = [], None
    for i, prompt in enumerate(prompts):
        seq = ref.submit(prompt, max_tokens=lengths[i], temperature=0, persist=i == 1)
        alone.append(drain(ref, [seq])[seq].tokens)
        if i == 1:
            alone_saved = ref.saved_prefix(seq)
    before = engine.stats()
    seqs = [engine.submit(p, max_tokens=n, temperature=0, persist=i == 1)
            for i, (p, n) in enumerate(zip(prompts, lengths))]
    w = Watch(engine)
    w.until(lambda: seqs[1] in w.ended)
    assert not w.ended & {seqs[0], seqs[2]}
    freed = engine.stats()  # from here slot 1 is free until slot 0 or 2 ends
    seen = window_tokens or lengths[0]
    w.until(lambda: w.tokens.get(seqs[0], 0) >= seen or w.ended & {seqs[0], seqs[2]})
    both = engine.stats()
    w.until(lambda: len(w.ended) == 3)
    after = engine.stats()
    return FreeSlotRun(
        alone=alone,
        together=[w.got[s] for s in seqs],
        same_kv=engine.saved_prefix(seqs[1]) == alone_saved,
        filler_rows=after["filler_rows"] - before["filler_rows"],
        window={k: both[k] - freed[k] for k in ("steps", "filler_rows", "ubatches", "finished")},
    )
