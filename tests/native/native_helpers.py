"""Helpers of the native engine tests (no fixtures here: see conftest.py)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from lmsp.native import Engine

# GPU layers of the fixtures' engines (conftest.py): 0, or 99 to run them on a GPU
N_GPU_LAYERS = int(os.environ.get("LMSP_TEST_N_GPU_LAYERS", "0"))


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
        self.ended: set[int] = set()

    def until(self, done) -> None:
        while not done():
            self.engine.wait(60)
            for res in self.engine.poll():
                self.tokens[res["seq"]] = self.tokens.get(res["seq"], 0) + len(res["tokens"])
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
