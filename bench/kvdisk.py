#!/usr/bin/env python3
"""The KV files (``DATA_DIR/kv``): the next turn of a conversation after a restart.

A conversation with about 2,000 tokens of history (a system message, a long
user message, the model's greedy answer) and a next question. Each round:

    lmsp       ``lmsp serve``: the first turn (a stored response, which writes a
               KV file: a chat completion writes none), the whole service
               SIGKILLed and started again, then the next turn (TTFT; the
               Responses API with the whole history as input)
    lmsp-nokv  the same with ``kv_cache_bytes = 0``: the next turn prefills
               the whole history again
    llama      llama-server, started fresh, asked the same next turn: it
               prefills the history again (no prompt cache survives it)

Before the measured turn each server answers a short request of another
client, so that the model is loaded and nothing of the conversation is in
memory. The figure is the median TTFT over the rounds, and its ratio.

The engine part (``--engine``, in this process) measures what a turn costs
the engine and the disk: the bytes of the file, the time of
``Engine.saved_prefix`` (a copy taken between two engine steps; the engine
thread's part alone too), of the write (temporary file, fsync, rename), of the
read and its check. And while one stream generates, another sequence with the
history finishes beside it and a thread writes its file as the service's KV
thread does (``saved_prefix`` into a kept buffer, ``kv.write``): the
longest gap between two tokens of the stream during that write, against the
stream's median gap (one engine step), both as this process's own thread sees
them. The control is the same stream right after the write: its longest gap
over as many steps as the write spanned. ``--writes`` repeats this (the
history's prompt then comes from the prefix cache); the summary keeps the worst.

    python bench/kvdisk.py --llama-server /path/to/llama-server        # SmolLM2, 3 rounds
    python bench/kvdisk.py --models smollm2-135m-instruct,gemma-3-270m --rounds 3
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_path import write_result  # noqa: E402
from serving.load import make_prompt  # noqa: E402
from serving.servers import (  # noqa: E402
    DEFAULT_LLAMA,
    LlamaServer,
    LmspServer,
    Server,
    ServeSettings,
    lmsp_command,
    make_models,
)
from serving.sse import iter_sse  # noqa: E402

from lmsp import kv  # noqa: E402
from lmsp.runtime.kv import LowPriority  # noqa: E402

SYSTEM = "You are a patient teacher. Answer in plain words and short sentences."
NEXT = "Now tell me in one sentence what all of this was about."
HISTORY_WORDS = 1650  # about 2,000 tokens of history with the template and the answer


def history(index: int) -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": make_prompt(index, HISTORY_WORDS)}]


def stream_chat(port: int, model: str, messages: list[dict], headers: dict, max_tokens: int,
                llama: bool = False) -> dict:
    """One streamed turn: its TTFT (to the first text), text and usage (chat completions'
    names). lmsp: a stored response (the Responses API), whose turn writes a KV file;
    llama-server: a chat completion without its prompt cache."""
    if llama:
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "cache_prompt": False}
        path = "/v1/chat/completions"
    else:
        body = {"model": model, "input": messages, "max_output_tokens": max_tokens, "temperature": 0,
                "stream": True}
        path = "/v1/responses"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    out: dict = {"text": "", "ttft": None, "usage": {}}
    started = time.perf_counter()
    try:
        conn.request("POST", path, body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream", **headers})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read(300)!r}")
        for _, data in iter_sse(resp):
            if data.strip() == "[DONE]":
                break
            text = _take(json.loads(data), out)
            if text:
                if out["ttft"] is None:
                    out["ttft"] = time.perf_counter() - started
                out["text"] += text
    finally:
        conn.close()
    return out


def _take(msg: dict, out: dict) -> str:
    """One streamed event: its text (a chat chunk's or a response's delta); the usage
    it carries into ``out`` (a response's as chat completions name it)."""
    if msg.get("object") == "chat.completion.chunk":
        out["usage"] = msg.get("usage") or out["usage"]
        return "".join((c.get("delta") or {}).get("content") or "" for c in msg.get("choices") or ())
    if msg.get("type") == "response.output_text.delta":
        return msg.get("delta") or ""
    ended = msg.get("type") in ("response.completed", "response.incomplete")
    usage = (msg.get("response") or {}).get("usage") if ended else None
    if usage:
        out["usage"] = {"prompt_tokens": usage.get("input_tokens"),
                        "prompt_tokens_details": usage.get("input_tokens_details") or {}}
    return ""


def kill(srv: Server) -> None:
    """SIGKILL the whole service at once (a crash, a power cut)."""
    if srv.proc is not None and srv.proc.poll() is None:
        os.killpg(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait()


def lmsp_round(model: Path, s: ServeSettings, work: Path, index: int, kv: bool, swa_full: bool = False) -> dict:
    """The first turn, a SIGKILL and a restart, then the next turn (see the module docstring)."""
    variant = "lmsp" if kv else "lmsp-nokv"
    env = {"LMSP_LOG_LEVEL": os.environ.get("KVDISK_LOG_LEVEL", "warning"), "LMSP_KV_SWA_FULL": str(int(swa_full))}
    if not kv:
        env["LMSP_KV_CACHE_BYTES"] = "0"
    srv = LmspServer.create(lmsp_command(None), model, s, work / variant, "lmsp", env)
    srv.start()
    try:
        srv.ready(s)
        token, other = srv.pair(), srv.pair()
        first = stream_chat(srv.port, model.stem, history(index), {"Authorization": f"Bearer {token}"}, 32)
        kv_dir = srv.data_dir / "kv"
        deadline = time.monotonic() + 60
        while kv and not kv.entries(kv_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        files = kv.entries(kv_dir)
        kill(srv)
        srv.start()
        srv.ready(s)
        stream_chat(srv.port, model.stem, [{"role": "user", "content": "Hello"}], {"Authorization": f"Bearer {other}"},
                    4)
        turn = [*history(index), {"role": "assistant", "content": first["text"]}, {"role": "user", "content": NEXT}]
        second = stream_chat(srv.port, model.stem, turn, {"Authorization": f"Bearer {token}"}, 16)
    finally:
        srv.stop()
    usage = second["usage"]
    return {"server": variant, "ttft_s": second["ttft"], "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "kv_file_bytes": sum(e.size for e in files), "first_answer": first["text"], "answer": second["text"],
            "turn": turn}


def llama_round(binary: Path, model: Path, s: ServeSettings, work: Path, turn: list[dict]) -> dict:
    srv = LlamaServer.create(binary, model, s, work, [])
    srv.start()
    try:
        srv.ready(s)
        stream_chat(srv.port, model.stem, [{"role": "user", "content": "Hello"}], {}, 4, llama=True)
        second = stream_chat(srv.port, model.stem, turn, {}, 16, llama=True)
    finally:
        srv.stop()
    return {"server": "llama", "ttft_s": second["ttft"], "prompt_tokens": second["usage"].get("prompt_tokens"),
            "answer": second["text"], "argv": shlex.join(srv.argv)}


DIGEST = "sha256:" + "0" * 64
STREAM = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]
GAPS_AFTER = 20  # the stream's tokens after the write at least, for its median step and the control


def engine_costs(model: Path, threads: int, writes: int = 1) -> dict:
    """What one turn's KV file costs (see the module docstring)."""
    from lmsp.native import Engine

    engine = Engine(str(model), n_ctx=4096, n_parallel=2, n_threads=threads, swa_full=False)  # the default
    try:
        prompt = engine.chat_prompt(history(7))
        with tempfile.TemporaryDirectory() as tmp:
            each = [write_beside_stream(engine, prompt, Path(tmp)) for _ in range(max(1, writes))]
            stats = engine.stats()
            out = worst_write(each)
            path = out.pop("path")
            turn = [*history(7), {"role": "assistant", "content": "Yes."}, {"role": "user", "content": NEXT * 3}]
            next_prompt = engine.chat_prompt(turn)
            t0 = time.perf_counter()
            prefix = kv.read(path, digest=DIGEST, kv_format=engine.info["kv_format"], cache_key="",
                                  tokens=next_prompt)
            t_read = time.perf_counter() - t0
        fresh = Engine(str(model), n_ctx=4096, n_parallel=2, n_threads=threads, swa_full=False)  # a restart
        try:
            fresh.submit(next_prompt, max_tokens=1, temperature=0, prefix=prefix)
            while not any(r["finish"] for r in _results(fresh)):
                pass
            loaded = fresh.stats()
        finally:
            fresh.close()
        return {"history_tokens": len(prompt), **out, "bytes_per_token": out["file_bytes"] / out["file_tokens"],
                "engine_thread_copy_s": stats["kv_copy_us"] / 1e6 / max(1, stats["kv_copies"]),
                "engine_thread_load_s": loaded["kv_load_us"] / 1e6 / max(1, loaded["kv_loads"]),
                "read_check_s": t_read, "n_swa": engine.info.get("n_swa"), "swa_full": engine.info.get("swa_full")}
    finally:
        engine.close()


def write_beside_stream(engine, prompt: list[int], directory: Path) -> dict:
    """A stream generates; the history's sequence runs beside it, ends, and a thread
    writes its file as the KV thread does; the stream's gaps before and during."""
    running = engine.submit(engine.chat_prompt(STREAM), max_tokens=3000, temperature=0)
    seq = engine.submit(prompt, max_tokens=16, temperature=0, persist=True)
    arrivals: list[float] = []
    done: dict = {}
    buffer = bytearray()

    def write() -> None:
        done["start"] = time.perf_counter()
        saved = engine.saved_prefix(seq, into=buffer)
        done["copied"] = time.perf_counter()
        try:
            done["path"], done["size"] = kv.write(
                directory, digest=DIGEST, kv_format=engine.info["kv_format"], cache_key="", tokens=saved["tokens"],
                tiled_rows=saved["tiled_rows"], tiled_min=saved["tiled_min"], state=saved["state"],
                offload=LowPriority())  # as the service's KV thread writes
            done["tokens"] = len(saved["tokens"])
        finally:
            saved["state"].release()
            done["end"] = time.perf_counter()

    writer = threading.Thread(target=write)
    ended = None
    while True:
        results = _results(engine)
        now = time.perf_counter()
        arrivals += [now for r in results if r["seq"] == running and r["tokens"]]
        if any(r["seq"] == running and r["finish"] for r in results):
            break
        if ended is None and any(r["seq"] == seq and r["finish"] for r in results):
            ended = now
            writer.start()
        if "end" in done and sum(t > done["end"] for t in arrivals) >= max(GAPS_AFTER, _spanned(arrivals, done) + 1):
            engine.cancel(running)
    writer.join()
    if "path" not in done:
        raise RuntimeError("the history's sequence left no KV to write (its slot, its window?)")
    pairs = [(a, b) for a, b in zip(arrivals, arrivals[1:]) if ended is not None and a >= ended]
    during = [b - a for a, b in pairs if b >= done["start"] and a <= done["end"]]
    # those gaps from the write's start (one begun before it counts: the write may have made it longer)
    spans = [(round(a - done["start"], 4), round(b - done["start"], 4)) for a, b in pairs
             if b >= done["start"] and a <= done["end"]]
    steady = [b - a for a, b in pairs if not (b >= done["start"] and a <= done["end"])]
    step = statistics.median(steady) if steady else None
    control = [b - a for a, b in pairs if a > done["end"]][:max(1, len(during))]
    return {"path": done["path"], "file_tokens": done["tokens"], "file_bytes": done["size"],
            "saved_prefix_s": done["copied"] - done["start"], "write_fsync_s": done["end"] - done["copied"],
            "median_token_gap_s": step,
            "max_gap_during_write_s": max(during) if during else None, "gaps_during_write": spans,
            "max_gap_control_s": max(control) if control else None, "control_gaps": len(control),
            "gaps_during": len(during), **_over_two_steps(during, control, step),
            "history_end_from_write_s": round(ended - done["start"], 4) if ended is not None else None,
            "stream_tokens": len(arrivals)}


def _spanned(arrivals: list[float], done: dict) -> int:
    """The stream's tokens that came while the write ran."""
    return sum(done["start"] <= t <= done["end"] for t in arrivals)


def _over_two_steps(during: list[float], control: list[float], step: float | None) -> dict:
    """How many gaps, during the write and in its control, took longer than two steps."""
    if step is None:
        return {}
    return {"over_two_steps_during": sum(g > 2 * step for g in during),
            "over_two_steps_control": sum(g > 2 * step for g in control)}


def worst_write(each: list[dict]) -> dict:
    """The write whose longest gap was the longest over its step, with every write's figures."""
    def excess(w: dict) -> float:
        return (w["max_gap_during_write_s"] or 0.0) / (w["median_token_gap_s"] or 1.0)

    worst = dict(max(each, key=excess))
    for w in each:
        if w is not worst and w.get("path") != worst["path"]:
            Path(w["path"]).unlink(missing_ok=True)
    keys = ("median_token_gap_s", "max_gap_during_write_s", "max_gap_control_s", "saved_prefix_s", "write_fsync_s",
            "gaps_during", "control_gaps", "over_two_steps_during", "over_two_steps_control")
    worst["writes"] = [{k: w.get(k) for k in keys} for w in each]
    return worst


def _results(engine) -> list[dict]:
    engine.wait(60)
    return engine.poll()


def run_model(name: str, model: Path, args, s: ServeSettings, work: Path) -> dict:
    rounds = []
    for r in range(args.rounds):
        print(f"{name}: round {r + 1}/{args.rounds}", flush=True)
        kv = lmsp_round(model, s, work, 100 + r, kv=True, swa_full=args.kv_swa_full)
        plain = lmsp_round(model, s, work, 100 + r, kv=False, swa_full=args.kv_swa_full)
        row = {"round": r + 1, "lmsp": kv, "lmsp-nokv": plain, "load_average": os.getloadavg()}
        if args.llama_server.exists():
            row["llama"] = llama_round(args.llama_server, model, s, work, kv["turn"])
        for part in ("lmsp", "lmsp-nokv"):
            row[part].pop("turn", None)
        print("  " + ", ".join(f"{k} TTFT {row[k]['ttft_s']:.3f} s" for k in ("lmsp", "lmsp-nokv", "llama")
                               if k in row) + f", cached {kv['cached_tokens']} of {kv['prompt_tokens']}",
              flush=True)
        rounds.append(row)
    out: dict = {"model": name, "rounds": rounds}
    if rounds:
        out["summary"] = summarize(name, rounds)
    if args.engine:
        out["engine"] = engine_costs(model, args.threads, args.writes)
        print(f"{name} engine: {json.dumps(out['engine'])}", flush=True)
    return out


def summarize(name: str, rounds: list[dict]) -> dict:
    med = {k: statistics.median(row[k]["ttft_s"] for row in rounds) for k in ("lmsp", "lmsp-nokv", "llama")
           if all(k in row for row in rounds)}
    summary = {"median_ttft_s": med,
               "speedup_over_nokv": med["lmsp-nokv"] / med["lmsp"],
               "same_answer_as_nokv": all(row["lmsp"]["answer"] == row["lmsp-nokv"]["answer"] for row in rounds)}
    if "llama" in med:
        summary["speedup_over_llama"] = med["llama"] / med["lmsp"]
    print(f"{name}: {json.dumps(summary)}", flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2-135m-instruct")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA)
    p.add_argument("--no-engine", dest="engine", action="store_false", help="skip the in-process engine part")
    p.add_argument("--writes", type=int, default=10,
                   help="KV writes beside a stream in the engine part (the worst is kept)")
    p.add_argument("--kv-swa-full", action="store_true",
                   help="the services keep every position of sliding-window layers (kv_swa_full = true)")
    p.add_argument("--out", type=Path, default=None,
                   help="the result file (default: bench/results/TIME-kvdisk-MODELS.json)")
    args = p.parse_args(argv)
    s = ServeSettings(threads=args.threads, parallel=2, ctx_per_seq=4096, n_gpu_layers=0)
    names = [n for n in args.models.split(",") if n]
    started = time.time()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kvdisk-") as tmp:
        work = Path(tmp)
        paths = make_models(names, [], work)
        models = [run_model(name, path, args, s, work) for name, path in zip(names, paths)]
    write_result("kvdisk" if args.rounds else "kvdisk_engine", names, {
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "command": shlex.join([sys.executable, *sys.argv]), "settings": vars(s), "models": models},
        started=started, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
