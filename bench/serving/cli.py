"""End-to-end serving benchmark: lmsp against llama-server, same model, same load.

Every server is started on loopback with the same thread count, parallel
sequences and context per sequence, then they are driven in turn (one at a
time; the others sit idle) by the same load generator: streamed requests with
fixed prompts, seeds and output lengths at several levels of concurrent
clients. With ``--rounds N`` each level is measured N times, the servers
taking turns in alternating order, and the median round is reported: on a
shared machine this keeps a change in background load from landing on one
server only. For every (model, server,
clients) it reports aggregate output tokens/s, time to first token and
inter-token latency (p50, p99), failed requests and the peak RSS of the server
process tree, then the ratio of each lmsp variant to llama-server.

    python bench/serve.py                         # the catalog models, 3 rounds (about an hour or two on 2 cores)
    python bench/serve.py --quick                 # the demo tiny model, one round: a smoke run
    python bench/serve.py --models tiny           # the per-request micro-benchmark; report it apart
    python bench/serve.py --models bench --clients 1,16 --n-gpu-layers 99
    python bench/serve.py --models tiny --turns 4 --prompt-cache   # conversations

Server variants (``--servers``):
    llama            llama-server built by bench/build_reference.sh
    lmsp             ``lmsp serve`` as shipped (durability "full": fsync per commit)
    lmsp-fast        batch_invariant=false: llama.cpp's faster CPU kernels, as
                     llama-server uses them (a setting users may choose)
    lmsp-mmap        mmap=true: the model file mapped, as llama-server does by
                     default, instead of read into the worker's memory
    lmsp-nofsync     durability "off": commits without fsync
    lmsp-nokv        kv_cache_bytes 0: no KV file after a finished turn
    lmsp-notiles     LMSP_TILE_MATMUL=0: every matrix product one vec_dot at a
                     time, without csrc/tile_matmul.cpp's tiles (the same
                     numbers; what the tiles gain)
    lmsp-windowN     commit_window_ms N (lmsp-window4, lmsp-window12, ...): the
                     group commit's window against the default (25 ms)
    lmsp-noevents    bench/variants.py's DeferredDeltas: delta events are not
                     written to the store, and streams get a task's text when
                     it ends (bench only; bounds what durability costs from
                     above: it also drops the per-token streaming)
    lmsp-memevents   bench/variants.py's EventsInMemory: a running task's events
                     are made as a commit makes them and streamed from memory,
                     and written only when the task ends (bench only; the same
                     streaming without the steps' transactions: what
                     durability costs)

Measurements, all taken by this client:
    TTFT     request sent -> first event that carries output text
    ITL      gap between consecutive text events, divided by the tokens the
             later event carries (llama-server's /completion says how many)
    event gap  the gap between consecutive text events as it is: a server
             that sends tokens in bunches (lmsp's group commit) has fewer,
             longer gaps, which the per-token ITL hides
    failed   over all rounds of a level (the row's other figures are its
             median round's)

lmsp is asked through its Responses API (``--api responses``, the default)
or its Chat Completions (``--api chat``). llama-server gets the same API
(``--llama-endpoint`` defaults to ``--api``), so both render the chat
template and parse the same request inside the time measured; ``chat`` is
its OpenAI chat endpoint, and
``completion`` its native one fed a prompt templated before the clock
starts (the least work per request). Both servers run with the same batch
(512) and flash attention (on for the CPU, off with layers on a GPU).
    tok/s    output tokens reported by the server's usage, summed over the
             successful requests of a level, over the level's wall time
    RSS      sum over the server's process tree of VmHWM (peak resident set),
             reset through /proc/PID/clear_refs at the start of each level
    PSS      the peak of the tree's summed proportional set sizes, sampled:
             pages two processes share count once. lmsp runs as a gunicorn
             master and its worker, which share most of the master's pages,
             so the RSS sum counts them twice; the memory goal is judged on
             PSS (for llama-server, one process, the two are the same)

Only the standard library is used, so the script runs from any Python 3.11
that can import ``lmsp`` (for the demo models) or with ``--model-file``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench_models import DEFAULT_MODELS
from results_path import RESULTS, git_state, write_result

from .load import LoadConfig, make_prompt, run_level
from .procs import RssWatch, exit_on_term, machine_line, raise_fd_limit
from .profiler import Profiler
from .protocols import ChatProtocol, CompletionProtocol, Protocol, ResponsesProtocol
from .report import fmt, model_record, print_summary
from .servers import (
    DEFAULT_LLAMA,
    ROOT,
    VARIANTS,
    LlamaServer,
    LmspServer,
    ServeSettings,
    Server,
    is_variant,
    llama_template_args,
    lmsp_command,
    make_models,
)
from .stats import LevelResult, median_rounds, ratio_rows, round_stats, summarize

DEFAULT_WORK = ROOT / "bench" / "out" / "serve"


@dataclass
class Contender:
    """One running server with what it takes to send it requests."""
    variant: str
    srv: Server
    proto: Protocol
    headers: dict
    watch: RssWatch


def llama_protocol(endpoint: str, port: int, model_id: str, cfg: LoadConfig) -> Protocol:
    """How llama-server is asked. Through its /v1/responses it reuses a slot's cached
    prompt prefix unless told not to, as its other endpoints are (cache_prompt):
    the service's own prefix cache is off unless --prompt-cache, so is this one."""
    if endpoint == "completion":
        return CompletionProtocol(port)
    if endpoint == "chat":
        return ChatProtocol()
    return ResponsesProtocol(model_id, {"min_p": 0.0, "cache_prompt": cfg.llama_prompt_cache})


def open_contender(variant: str, model: Path, args, cfg: LoadConfig, s: ServeSettings, work: Path,
                   lmsp_cmd: list[str], commands: dict) -> Contender:
    if variant == "llama":
        srv = LlamaServer.create(args.llama_server, model, s, work,
                                 [*llama_template_args(model, work), *args.llama_arg])
    else:
        srv = LmspServer.create(lmsp_cmd, model, s, work, variant,
                                {"LMSP_PREFIX_CACHE": "1" if cfg.llama_prompt_cache else "0"})
    commands[f"{variant} {model.stem}"] = shlex.join(srv.argv)
    srv.start()
    try:
        srv.ready(s)
        headers: dict = {}
        if variant == "llama":
            proto = llama_protocol(args.llama_endpoint, srv.port, model.stem, cfg)
        else:
            headers = {"Authorization": f"Bearer {srv.pair()}"}
            proto = ChatProtocol(model.stem, llama=False) if args.api == "chat" else ResponsesProtocol(model.stem)
        # warm-up: load the model (lmsp loads it on first use) and touch every code path once
        if isinstance(proto, CompletionProtocol):
            for i in range(args.warmup):
                proto.prepare(make_prompt(10**6 + i, cfg.prompt_words, cfg.shared_words))
        warm = run_level(srv.port, proto, headers, min(2, s.parallel), args.warmup, cfg, first_index=10**6)
        bad = [r.error for r in warm if not r.ok]
        if bad:
            print(f"  warm-up failures on {variant}: {bad[:3]}", flush=True)
    except BaseException:
        srv.stop()
        raise
    return Contender(variant, srv, proto, headers, RssWatch(srv.proc.pid))


def measure(c: Contender, model: Path, clients: int, n: int, first_index: int, cfg: LoadConfig,
            rnd: int, profiler: Profiler | None = None) -> LevelResult:
    if isinstance(c.proto, CompletionProtocol):
        for i in range(first_index, first_index + n):
            c.proto.prepare(make_prompt(i, cfg.prompt_words, cfg.shared_words))
    if profiler is not None:
        profiler.start(c.srv.proc.pid, f"{model.stem}-{c.variant}-{clients}c-r{rnd}")
    c.watch.start()
    try:
        results = run_level(c.srv.port, c.proto, c.headers, clients, n, cfg, first_index=first_index)
    finally:
        peak = c.watch.stop()
        if profiler is not None:
            profiler.stop()
    lvl = summarize(model.stem, c.variant, clients, results, cfg.max_tokens, peak)
    lvl.round = rnd
    lvl.peak_pss_mb = round(c.watch.peak_pss / 1048576.0, 1)
    if lvl.output_tokens:
        lvl.cpu_ms_per_token = round(c.watch.cpu_s * 1000.0 / lvl.output_tokens, 4)
    print(f"  {lvl.server:14s} {clients:3d} clients r{rnd}: {lvl.tok_s:8.1f} tok/s  TTFT p50 {fmt(lvl.ttft_p50_ms)} "
          f"p99 {fmt(lvl.ttft_p99_ms)} ms  ITL p50 {fmt(lvl.itl_p50_ms, 2)} p99 {fmt(lvl.itl_p99_ms, 2)} ms  "
          f"failed {lvl.failed}/{lvl.requests}  CPU {fmt(lvl.cpu_ms_per_token, 3)} ms/tok  "
          f"RSS {fmt(lvl.peak_rss_mb)} PSS {fmt(lvl.peak_pss_mb)} MB  "
          f"load {lvl.load_avg:.1f}"
          + (f"  errors: {lvl.errors}" if lvl.errors else ""), flush=True)
    if not c.srv.alive():
        print(f"  {c.variant} died during the {clients}-client level:\n{c.srv.log_tail()}", flush=True)
    return lvl




def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--models", default=DEFAULT_MODELS,
                   help="catalog models (fetched into the cache) or demo shapes (comma list; '' for none). "
                        "The demo 'tiny' measures the service's own cost per request and per token; "
                        "report it apart from the real models")
    p.add_argument("--model-file", action="append", default=[], help="an existing GGUF to run as well")
    p.add_argument("--servers", default="llama,lmsp,lmsp-memevents",
                   help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--clients", default="1,4,16,64", help="concurrency levels")
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--min-requests", type=int, default=6, help="at least this many requests per level")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured requests before the levels")
    p.add_argument("--rounds", type=int, default=3,
                   help="measure each level this many times, servers taking turns; report the median round")
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens per request")
    p.add_argument("--prompt-words", type=int, default=24)
    p.add_argument("--turns", type=int, default=1,
                   help="requests per conversation: each repeats the conversation so far with the server's "
                        "answers, then asks its own question (with --prompt-cache, both servers can reuse it)")
    p.add_argument("--shared-words", type=int, default=0,
                   help="words every prompt begins with, before its own (a shared system message; "
                        "with --prompt-cache both servers can reuse them)")
    _server_options(p)
    args = p.parse_args(argv)
    if args.llama_endpoint is None:
        args.llama_endpoint = args.api
    if args.quick:
        args.models = "tiny" if args.models == DEFAULT_MODELS else args.models
        args.rounds = 1
        args.max_tokens = min(args.max_tokens, 32)
        args.requests_per_client = 1
        args.min_requests = min(args.min_requests, 4)
        args.warmup = 1
    return args


def _server_options(p: argparse.ArgumentParser) -> None:
    """Sampling, the servers' settings and commands, and where the results go."""
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--parallel", type=int, default=0, help="sequences decoded together (0: the largest --clients)")
    p.add_argument("--ctx", type=int, default=0, help="context per sequence (0: enough for prompt + output)")
    p.add_argument("--n-gpu-layers", type=int, default=0)
    p.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA)
    # responses: the API lmsp serves, so both servers render the chat template and parse the
    # same request inside the time measured (/completion is fed a prompt templated beforehand)
    p.add_argument("--llama-endpoint", choices=("completion", "chat", "responses"), default=None,
                   help="default: the --api lmsp is asked through")
    p.add_argument("--api", choices=("responses", "chat"), default="responses",
                   help="what lmsp is asked through: its Responses API, or its Chat Completions "
                        "(streamed chunks with the usage chunk)")
    p.add_argument("--llama-arg", action="append", default=[], help="extra llama-server argument (repeatable)")
    p.add_argument("--prompt-cache", "--llama-prompt-cache", dest="llama_prompt_cache", action="store_true",
                   help="let both servers reuse the prompt prefix a slot holds from its previous request "
                        "(llama-server's cache_prompt, lmsp's prefix_cache); by default both prefill every "
                        "prompt in full")
    p.add_argument("--lmsp", default=None, help="command that runs the lmsp CLI (default: .venv/bin/lmsp)")
    p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK)
    p.add_argument("--json", type=Path, default=None, help="write all results here (default: WORK/results.json)")
    p.add_argument("--results-dir", type=lambda v: Path(v) if v else None, default=RESULTS,
                   help="also write one record per model here, TIME-serve-MODEL.json ('' for none)")
    p.add_argument("--profile", choices=("py-spy", "perf"), default=None,
                   help="sample each server's busiest process during every level (files in WORK/profiles)")
    p.add_argument("--quick", action="store_true",
                   help="tiny model only, 32 output tokens, fewest requests: a smoke run")


@dataclass
class Run:
    """One run of the benchmark: its settings, and what it has measured so far."""
    args: argparse.Namespace
    variants: list[str]
    clients: list[int]
    cfg: LoadConfig
    s: ServeSettings
    work: Path
    out: Path
    source: dict  # the code measured: git_state() as the run starts
    levels: list[LevelResult] = field(default_factory=list)
    commands: dict[str, str] = field(default_factory=dict)
    missed: list[str] = field(default_factory=list)  # levels of a server that had died (or never started)

    def save(self) -> None:
        """Every figure so far to --json (written after every server too, so that a run cut
        short keeps what it measured)."""
        self.out.write_text(json.dumps({
            "machine": machine_line(), "argv": sys.argv, "settings": asdict(self.s), "load": asdict(self.cfg),
            "llama_endpoint": self.args.llama_endpoint, "api": self.args.api, "commands": self.commands,
            "rounds": self.args.rounds, "levels": [asdict(x) for x in median_rounds(self.levels)],
            "ratios": ratio_rows(median_rounds(self.levels)), "all_rounds": [asdict(x) for x in self.levels],
            "over_rounds": round_stats(self.levels),
        }, indent=2))


def prepare(args: argparse.Namespace) -> Run:
    """The run the arguments ask for, checked: servers, levels, load and server settings."""
    variants = [v for v in args.servers.split(",") if v]
    for v in variants:
        if not is_variant(v):
            raise SystemExit(f"unknown server {v!r}; known: {', '.join(VARIANTS)}")
    clients = [int(c) for c in args.clients.split(",") if c]
    if not clients or min(clients) < 1:
        raise SystemExit("--clients needs positive integers")
    if "llama" in variants and not args.llama_server.is_file():
        raise SystemExit(f"{args.llama_server} not found: run bench/build_reference.sh first "
                         "(or pass --llama-server, or leave llama out of --servers)")
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    turns = max(1, args.turns)
    cfg = LoadConfig(max_tokens=args.max_tokens, prompt_words=args.prompt_words, shared_words=args.shared_words,
                     turns=turns, temperature=args.temperature, top_k=args.top_k, seed=args.seed,
                     llama_prompt_cache=args.llama_prompt_cache)
    # words of a conversation's last request (about 8 more a question around its own
    # words, an earlier answer counted as its tokens), at most 3 tokens a word
    words = (args.prompt_words + 8) * turns + args.shared_words + args.max_tokens * (turns - 1)
    ctx = args.ctx or max(256, 2 ** math.ceil(math.log2(words * 3 + 64 + args.max_tokens)))
    s = ServeSettings(threads=args.threads, parallel=args.parallel or max(clients),
                      ctx_per_seq=ctx, n_gpu_layers=args.n_gpu_layers)
    out = args.json or work / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    return Run(args, variants, clients, cfg, s, work, out, git_state())


def run_model(run: Run, model: Path) -> None:
    """Every server on ``model``, every level and round; then the model's record."""
    args, started = run.args, time.time()
    print(f"model {model.name} ({model.stat().st_size / 1e6:.1f} MB)", flush=True)
    running: list[Contender] = []
    lmsp_cmd = lmsp_command(args.lmsp)
    try:
        for variant in run.variants:
            try:
                running.append(open_contender(variant, model, args, run.cfg, run.s, run.work, lmsp_cmd,
                                              run.commands))
            except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as exc:
                print(f"  {variant} on {model.name} did not start: {exc}", flush=True)
                run.missed.append(f"{variant} on {model.name}: did not start")
        measure_levels(run, model, running)
    finally:
        for c in running:
            c.srv.stop()
        run.save()
    mine = [x for x in run.levels if x.model == model.stem]
    if args.results_dir is not None and mine:
        kind = "serve_chat" if args.api == "chat" else "serve"
        write_result(kind, model.stem, model_record(mine, args, run.commands, run.s, run.cfg),
                     started=started, folder=args.results_dir, source=run.source)


def measure_levels(run: Run, model: Path, running: list[Contender]) -> None:
    """Each level ``--rounds`` times, the servers taking turns in alternating order (so that
    none always goes first after a pause), each given the same request indices."""
    args, index = run.args, 0
    for clients in run.clients:
        n = max(args.min_requests, clients * args.requests_per_client)
        for rnd in range(args.rounds):
            for c in (running if rnd % 2 == 0 else running[::-1]):
                if not c.srv.alive():
                    run.missed.append(f"{c.variant} on {model.name}, {clients} clients, round {rnd + 1}")
                    continue
                prof = Profiler(args.profile, run.work / "profiles") if args.profile else None
                run.levels.append(measure(c, model, clients, n, index, run.cfg, rnd, prof))
            index += n
        run.save()


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, exit_on_term)
    run = prepare(args)
    raise_fd_limit()
    models = make_models([m for m in args.models.split(",") if m], args.model_file, run.work)
    s, cfg = run.s, run.cfg
    print(f"machine: {machine_line()}")
    print(f"settings: threads={s.threads} parallel={s.parallel} ctx/seq={s.ctx_per_seq} "
          f"ngl={s.n_gpu_layers} max_tokens={cfg.max_tokens} temperature={cfg.temperature} top_k={cfg.top_k} "
          f"llama endpoint={args.llama_endpoint} prompt caches={args.llama_prompt_cache} "
          f"shared words={cfg.shared_words} turns={cfg.turns}", flush=True)
    for model in models:
        run_model(run, model)
    print_summary(run.levels, args.rounds, run.missed)
    run.save()
    print(f"\nresults: {run.out}")
    failed = sum(x.failed for x in run.levels)
    return 1 if failed or run.missed or not run.levels else 0
