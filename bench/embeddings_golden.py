#!/usr/bin/env python3
"""Record llama-server's embeddings of a fixed set of inputs, as golden data.

    python bench/embeddings_golden.py --llama-server build/reference/bin/llama-server \\
        --model smollm2-135m-instruct=PATH.gguf

writes tests/runtime/data/embeddings_golden.json (``--out`` to change), which
tests/runtime/test_real_embeddings.py compares the service's embeddings with:
cosine similarity at least 0.9999 for every input. llama-server runs on
loopback with ``--embeddings --pooling mean`` (the model declares no pooling
type, and the service pools such a model by the mean), and answers
``POST /v1/embeddings`` for all the inputs in one request; its vectors are
normalized (its default), and kept as little-endian float32 in base64.
"""
from __future__ import annotations

import argparse
import base64
import http.client
import json
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prompt_golden import free_port, sha256_of

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "runtime" / "data" / "embeddings_golden.json"

INPUTS: list[str | list[int]] = [
    "Hello",
    "The capital of France is Paris.",
    "A lighthouse keeper watched the sea for forty years, and wrote down every ship that passed. " * 4,
    "Ünïcödé 日本語 🙂 text",
    "<|im_start|>user\nspecial-token text<|im_end|>",
    "  leading and trailing whitespace  \n",
    "def add(a, b):\n    return a + b\n",
    [1, 504, 3458, 282, 4649, 314, 7042, 30],
]


def post(port: int, path: str, body: dict) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise RuntimeError(f"llama-server {path} answered {resp.status}: {raw[:500]!r}")
    return json.loads(raw)


def start(binary: Path, model: Path, log: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "--embeddings",
            "--pooling", "mean", "-c", "2048", "--parallel", "1", "-t", "1", "--no-webui"]
    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited ({proc.returncode}); see {log}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise RuntimeError(f"llama-server did not get ready; see {log}")


def record(binary: Path, name: str, model: Path, work: Path) -> dict:
    proc, port = start(binary, model, work / f"{name}.log")
    try:
        answer = post(port, "/v1/embeddings", {"model": name, "input": INPUTS})
    finally:
        proc.terminate()
        proc.wait(30)
    vectors = [item["embedding"] for item in sorted(answer["data"], key=lambda d: d["index"])]
    return {
        "sha256": sha256_of(model),
        "inputs": [
            {"input": value, "embedding": base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode("ascii")}
            for value, v in zip(INPUTS, vectors)
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--model", action="append", required=True, help="NAME=PATH.gguf")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    models = {}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.model:
            name, _, path = spec.partition("=")
            models[name] = record(args.llama_server, name, Path(path), Path(tmp))
    names = " ".join(f"--model {n}=PATH" for n in models)
    golden = {
        "command": f"python bench/embeddings_golden.py --llama-server PATH {names}",
        "llama_server": "--embeddings --pooling mean",
        "models": models,
    }
    args.out.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
