"""Embeddings' speed: inputs per second through ``POST /v1/embeddings``, lmsp
against llama-server (``--embedding --pooling mean``), same model, same load.

Both servers run the model with the same threads, parallel sequences, context
per sequence and batch (bench/serve.py's settings; llama-server with ``-b`` and
``-ub`` 512, lmsp's embedder in passes of at most 256 rows). The load is
``--inputs`` inputs (256) of ``--tokens`` tokens (64) each, given as token ids
so that both servers embed exactly the same tokens, sent as requests of
``--per-request`` inputs (all of them in one request by default) by
``--clients`` concurrent clients; ``--batches 1,32,256`` measures each of
several request sizes in turn. A round sends the whole load to each server
in turn, the order alternating from round to round so that a change in the
machine's background load does not land on one server only; the figure is the
median round's inputs/s, and the ratio the median of the rounds' ratios. The
CPU time each server's process tree spends on a round is counted too (CPU
milliseconds per input): on a shared machine it moves less with the other
load than the wall time does. Every input's vectors from both servers are
compared once (cosine similarity).

    python bench/embeddings.py --model ~/.cache/lmsp/models/smollm2-135m-instruct.gguf \\
        --llama-server /work/ref/bin/llama-server --rounds 5
    python bench/embeddings.py --model ~/.cache/lmsp/models/all-minilm-l6-v2.gguf \\
        --llama-server build/reference/bin/llama-server --batches 1,32,256 --goal 1.5

Goal: lmsp >= 0.95x llama-server's inputs/s (``--goal``).
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_path import git_state, write_result  # noqa: E402
from serving.procs import free_port, tree_cpu_seconds  # noqa: E402
from serving.servers import LlamaServer, LmspServer, ServeSettings, lmsp_command  # noqa: E402
from serving.sse import http_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOAL = 0.95
WORDS = ("river stone lantern orbit velvet copper meadow signal harbor quartz ember falcon prism tundra cobalt "
         "willow summit beacon cinder glacier marble thistle anchor comet saffron canyon ripple fable").split()


def llama_server(binary: Path, model: Path, s: ServeSettings, work: Path, extra: list[str]) -> LlamaServer:
    """llama-server for embeddings: mean pooling (the catalog models declare none, and lmsp
    pools such a model by the mean), one unified KV cache as lmsp's embedder has it."""
    argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(free_port()),
            "-t", str(s.threads), "-tb", str(s.threads), "--parallel", str(s.parallel),
            "-c", str(s.ctx_per_seq * s.parallel), "--kv-unified", "-b", "512", "-ub", "512",
            "--embedding", "--pooling", "mean", "--no-webui", "--log-disable", *extra]
    srv = LlamaServer(argv, dict(os.environ), work / "logs" / f"llama-embed-{model.stem}.log", work)
    srv.port = int(argv[argv.index("--port") + 1])
    return srv


def make_inputs(llama: LlamaServer, count: int, tokens: int) -> list[list[int]]:
    """``count`` inputs of exactly ``tokens`` token ids each, every one its own words
    (tokenized by llama-server as it tokenizes a text: special tokens added)."""
    out = []
    for i in range(count):
        words = " ".join(WORDS[(i * 7 + k * (i % 5 + 1)) % len(WORDS)] for k in range(tokens))
        status, body = http_json(llama.port, "POST", "/tokenize", {"content": f"Note {i}: {words}",
                                                                   "add_special": True})
        assert status == 200 and body and len(body["tokens"]) >= tokens, (status, body)
        out.append([int(t) for t in body["tokens"][:tokens]])
    return out


def embed(port: int, inputs: list[list[int]], token: str | None, model: str) -> list[list[float]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    status, body = http_json(port, "POST", "/v1/embeddings", {"model": model, "input": inputs}, headers=headers,
                             timeout=600)
    assert status == 200 and body, (status, str(body)[:500])
    return [d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])]


def one_round(port: int, inputs: list[list[int]], token: str | None, model: str, per_request: int,
              clients: int) -> float:
    """The whole load sent once; its inputs per second over the wall time."""
    chunks = [inputs[i:i + per_request] for i in range(0, len(inputs), per_request)]
    lock = threading.Lock()
    failed: list[BaseException] = []

    def client() -> None:
        while True:
            with lock:
                if not chunks:
                    return
                chunk = chunks.pop()
            try:
                embed(port, chunk, token, model)
            except BaseException as exc:  # noqa: BLE001 (reported after the round)
                failed.append(exc)
                return

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if failed:
        raise failed[0]
    return len(inputs) / wall


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def measure(llama: LlamaServer, lmsp: LmspServer, token: str, inputs: list[list[int]], model: str,
            per_request: int, clients: int, rounds: int) -> dict:
    """Rounds of the whole load in requests of ``per_request`` inputs, alternating the servers."""
    rows: list[dict] = []
    for r in range(rounds):
        order = [("llama", llama.port, None), ("lmsp", lmsp.port, token)]
        if r % 2:
            order.reverse()
        row: dict = {"load_before": round(os.getloadavg()[0], 2)}
        for name, port, key in order:
            pid = (lmsp if key else llama).proc.pid
            cpu = tree_cpu_seconds(pid)
            row[name] = one_round(port, inputs, key, model, per_request, clients)
            row[f"{name}_cpu_ms_per_input"] = (tree_cpu_seconds(pid) - cpu) * 1000 / len(inputs)
        row["load_after"] = round(os.getloadavg()[0], 2)
        row["ratio"] = row["lmsp"] / row["llama"]
        row["cpu_ratio"] = row["lmsp_cpu_ms_per_input"] / row["llama_cpu_ms_per_input"]
        rows.append(row)
        print(f"batch {per_request}, round {r + 1}: llama-server {row['llama']:.2f}, lmsp {row['lmsp']:.2f} "
              f"inputs/s ({row['ratio']:.3f}x; load {row['load_before']}-{row['load_after']}); CPU ms per input "
              f"{row['llama_cpu_ms_per_input']:.1f} and {row['lmsp_cpu_ms_per_input']:.1f} "
              f"({row['cpu_ratio']:.3f}x)", flush=True)
    return {
        "inputs_per_s": {who: statistics.median(r[who] for r in rows) for who in ("lmsp", "llama")},
        "ratio": statistics.median(r["ratio"] for r in rows),
        "cpu_ms_per_input": {who: statistics.median(r[f"{who}_cpu_ms_per_input"] for r in rows)
                             for who in ("lmsp", "llama")},
        "cpu_ratio": statistics.median(r["cpu_ratio"] for r in rows),
        "rounds": rows,
    }


def run(args) -> dict:
    s = ServeSettings(threads=args.threads, parallel=args.parallel, ctx_per_seq=args.ctx, n_gpu_layers=0)
    work = Path(args.work)
    model = Path(args.model).expanduser()
    llama = llama_server(Path(args.llama_server), model, s, work, args.llama_arg)
    lmsp = LmspServer.create(lmsp_command(args.lmsp), model, s, work, args.variant, {})
    batches = [int(b) for b in args.batches.split(",")] if args.batches else [args.per_request]
    try:
        for srv in (llama, lmsp):
            srv.start()
        llama.ready(s)
        lmsp.ready(s)
        token = lmsp.pair()
        inputs = make_inputs(llama, args.inputs, args.tokens)
        # a first pass each (lmsp makes its embedder on first use); every input's vectors compared
        similarity = 1.0
        for start in range(0, len(inputs), 256):
            chunk = inputs[start:start + 256]
            pairs = zip(embed(llama.port, chunk, None, model.stem), embed(lmsp.port, chunk, token, model.stem))
            similarity = min([similarity] + [cosine(a, b) for a, b in pairs])
        results = {b: measure(llama, lmsp, token, inputs, model.stem, b, args.clients, args.rounds) for b in batches}
    finally:
        lmsp.stop()
        llama.stop()
    first = results[batches[0]]
    return {
        **{k: first[k] for k in ("inputs_per_s", "ratio", "cpu_ms_per_input", "cpu_ratio", "rounds")},
        "batches": {str(b): r for b, r in results.items()},
        "min_cosine_similarity": similarity,
        "settings": {"threads": s.threads, "parallel": s.parallel, "ctx_per_seq": s.ctx_per_seq, "batch": 512,
                     "ubatch": 512, "llama_args": llama.argv[1:]},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, type=lambda v: str(Path(v).expanduser().resolve()))
    p.add_argument("--llama-server", required=True, type=lambda v: str(Path(v).resolve()))
    p.add_argument("--llama-arg", action="append", default=[], help="extra llama-server argument (repeatable)")
    p.add_argument("--lmsp", default=None, help="the lmsp command (default: the virtualenv's)")
    p.add_argument("--variant", choices=("lmsp", "lmsp-fast"), default="lmsp",
                   help="lmsp as shipped, or with batch_invariant=false (bench/serve.py's variants)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--parallel", type=int, default=8, help="sequences (llama-server's slots; lmsp's engine)")
    p.add_argument("--ctx", type=int, default=512, help="context per sequence")
    p.add_argument("--inputs", type=int, default=256)
    p.add_argument("--tokens", type=int, default=64, help="tokens per input")
    p.add_argument("--per-request", type=int, default=256, help="inputs per request")
    p.add_argument("--batches", default=None,
                   help="several request sizes measured in turn, e.g. 1,32,256 (instead of --per-request)")
    p.add_argument("--goal", type=float, default=GOAL, help="lmsp's inputs/s over llama-server's that passes")
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--work", default=str(ROOT / "bench" / "out" / "embeddings"))
    p.add_argument("--out", default=None,
                   help="result JSON (default: bench/results/TIME-embeddings-MODEL.json)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the servers stopped on the way out
    source, started = git_state(), time.time()
    result = run(args)
    model = Path(args.model).stem
    record = {"model": model, "command": " ".join(["python", "bench/embeddings.py", *(argv or sys.argv[1:])]),
              "inputs": args.inputs, "tokens": args.tokens, "per_request": args.per_request,
              "clients": args.clients, "variant": args.variant, "goal": args.goal, **result}
    kind = "embeddings" if args.variant == "lmsp" else "embeddings_fast"
    out = write_result(kind, model, record, started=started, source=source, out=Path(args.out) if args.out else None)
    for batch, one in result["batches"].items():
        rate = one["inputs_per_s"]
        print(f"batch {batch}: lmsp {rate['lmsp']:.1f} inputs/s, llama-server {rate['llama']:.1f}: "
              f"{one['ratio']:.3f}x (goal >= {args.goal}); CPU per input {one['cpu_ratio']:.3f}x llama-server's "
              f"({one['cpu_ms_per_input']['lmsp']:.2f} against {one['cpu_ms_per_input']['llama']:.2f} ms)")
    print(f"every vector's cosine similarity to llama-server's >= {result['min_cosine_similarity']:.6f}")
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
