"""Embeddings of a real model against llama-server's: the golden data
(tests/runtime/data/embeddings_golden.json) is llama-server's ``/v1/embeddings``
with ``--pooling mean`` on the same file, recorded by bench/embeddings_golden.py;
every input's vector here has cosine similarity at least 0.9999 with it."""
from __future__ import annotations

import base64
import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from lmsp.native import Engine
from lmsp.runtime.embeddings import Embeddings

pytestmark = pytest.mark.real_model

GOLDEN = json.loads((Path(__file__).resolve().parent / "data" / "embeddings_golden.json").read_text())
MODEL = "smollm2-135m-instruct"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def test_the_embeddings_are_llama_servers(smollm2_path):
    golden = GOLDEN["models"][MODEL]
    assert sha256_of(smollm2_path) == golden["sha256"], "the golden data is of another file"
    with Engine(str(smollm2_path), n_ctx=2048, n_parallel=1, n_threads=1) as engine:
        tokens = [Embeddings._tokens(engine, case["input"], i) for i, case in enumerate(golden["inputs"])]
        together = engine.embed(tokens)
    for case, vector in zip(golden["inputs"], together):
        raw = base64.b64decode(case["embedding"])
        expected = np.array(struct.unpack(f"<{len(raw) // 4}f", raw), dtype=np.float64)
        cosine = float(vector @ expected / np.linalg.norm(expected))
        assert cosine >= 0.9999, (case["input"], cosine)
