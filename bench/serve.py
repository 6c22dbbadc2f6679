#!/usr/bin/env python3
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
import http.client
import json
import math
import os
import platform
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import dataclasses
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this script
from bench_models import DEFAULT_MODELS, has_chat_template, resolve
from serve_results import DEFAULT_RESULTS, git_state, paired_ratios, paired_table, write_model_results

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WORK = ROOT / "bench" / "out" / "serve"
DEFAULT_LLAMA = ROOT / "build" / "reference" / "bin" / "llama-server"
LMSP_SCOPES = "responses:write,responses:read,models:read"
VARIANTS = ("llama", "lmsp", "lmsp-fast", "lmsp-mmap", "lmsp-nofsync", "lmsp-nokv", "lmsp-notiles", "lmsp-windowN",
            "lmsp-noevents", "lmsp-memevents")
VARIANTS_PATH = os.pathsep.join(filter(None, (str(ROOT / "bench"), os.environ.get("PYTHONPATH"))))
LMSP_VARIANT_ENV = {
    "lmsp": {},
    "lmsp-fast": {"LMSP_BATCH_INVARIANT": "0"},
    "lmsp-mmap": {"LMSP_MMAP": "1"},
    "lmsp-nofsync": {"LMSP_DURABILITY": "off"},
    "lmsp-nokv": {"LMSP_KV_CACHE_BYTES": "0"},  # no KV files of finished turns
    "lmsp-notiles": {"LMSP_TILE_MATMUL": "0"},  # csrc/tile_matmul.cpp off: vec_dot for every product
    # the commit variants of bench/variants.py, through the service's hook for another app
    "lmsp-noevents": {"LMSP_GUNICORN_APP": "variants:get_app('noevents')", "PYTHONPATH": VARIANTS_PATH},
    "lmsp-memevents": {"LMSP_GUNICORN_APP": "variants:get_app('memevents')", "PYTHONPATH": VARIANTS_PATH},
}

# Fixed prompt material. Request i gets its own first words, so no server can
# answer it from a cached prefix of an earlier request.
_WORDS = ("river stone lantern orbit velvet copper meadow signal harbor quartz "
          "ember falcon prism tundra cobalt willow summit beacon cinder glacier "
          "marble thistle anchor comet saffron canyon ripple fable juniper atlas").split()


def make_prompt(index: int, n_words: int, shared_words: int = 0) -> str:
    """Request ``index``'s prompt: its own ``n_words``, after ``shared_words``
    that every request begins with (a system message, say)."""
    words = [_WORDS[(index * 7 + k * (index % 5 + 1)) % len(_WORDS)] for k in range(n_words)]
    prompt = f"Story {index}: " + " ".join(words) + ". Continue the story."
    if shared_words:
        prompt = "Background: " + " ".join(_WORDS[(3 * k) % len(_WORDS)] for k in range(shared_words)) + ". " + prompt
    return prompt


# --------------------------------------------------------------------------- stats

def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class RequestResult:
    ok: bool = False
    error: str | None = None
    t_start: float = 0.0
    t_end: float = 0.0
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)   # per-token inter-token gaps
    event_gaps: list[float] = field(default_factory=list)  # gaps between text events, as the client waits
    text_events: int = 0
    output_tokens: int = 0
    input_tokens: int = 0
    text: str = ""          # the output text (kept for a conversation's next turn)


@dataclass
class LevelResult:
    model: str
    server: str
    clients: int
    requests: int
    failed: int
    output_tokens: int
    wall_s: float
    tok_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    peak_rss_mb: float | None
    short_outputs: int          # successful requests that stopped before max tokens
    mean_input_tokens: float
    tokens_per_event: float     # output tokens per text event: >1 when a server bunches tokens
    load_avg: float             # 1-minute load average of the machine at the end of the level
    errors: list[str]
    round: int = 0
    peak_pss_mb: float | None = None   # sampled sum of the tree's proportional set sizes
    cpu_ms_per_token: float | None = None  # CPU time of the server's processes / output tokens
    # the gaps between text events: a server that sends tokens in bunches has fewer,
    # longer ones, which the per-token ITL (each gap spread over its tokens) hides
    event_gap_p50_ms: float | None = None
    event_gap_p99_ms: float | None = None


def summarize(model: str, server: str, clients: int, results: list[RequestResult],
              max_tokens: int, peak_rss: int | None) -> LevelResult:
    ok = [r for r in results if r.ok]
    out = sum(r.output_tokens for r in ok)
    wall = (max(r.t_end for r in results) - min(r.t_start for r in results)) if results else 0.0
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    gaps = [g for r in ok for g in r.gaps]
    event_gaps = [g for r in ok for g in r.event_gaps]
    ms = lambda v: None if v is None else round(v * 1000.0, 2)  # noqa: E731
    errors = sorted({r.error or "?" for r in results if not r.ok})
    return LevelResult(
        model=model, server=server, clients=clients, requests=len(results),
        failed=len(results) - len(ok), output_tokens=out, wall_s=round(wall, 3),
        tok_s=round(out / wall, 2) if wall > 0 else 0.0,
        ttft_p50_ms=ms(percentile(ttfts, 50)), ttft_p99_ms=ms(percentile(ttfts, 99)),
        itl_p50_ms=ms(percentile(gaps, 50)), itl_p99_ms=ms(percentile(gaps, 99)),
        event_gap_p50_ms=ms(percentile(event_gaps, 50)), event_gap_p99_ms=ms(percentile(event_gaps, 99)),
        peak_rss_mb=None if peak_rss is None else round(peak_rss / 1048576.0, 1),
        short_outputs=sum(1 for r in ok if r.output_tokens < max_tokens),
        mean_input_tokens=round(sum(r.input_tokens for r in ok) / len(ok), 1) if ok else 0.0,
        tokens_per_event=round(out / max(1, sum(r.text_events for r in ok)), 2),
        load_avg=round(os.getloadavg()[0], 2),
        errors=errors[:5],
    )


# --------------------------------------------------------------------------- processes

def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: split after the last ')'
        fields_ = stat[stat.rfind(b")") + 2:].split()
        kids.setdefault(int(fields_[1]), []).append(int(entry))
    return kids


def process_tree(root: int) -> list[int]:
    kids = _children_map()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


def _status_kb(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _pss(pid: int) -> int:
    """Proportional set size in bytes: pages shared between processes (a forked
    master and worker, say) are split between them instead of counted twice."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads, so far."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return 0.0
    fields_ = stat[stat.rfind(b")") + 2:].split()
    return (int(fields_[11]) + int(fields_[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int) -> float:
    return sum(_cpu_seconds(pid) for pid in process_tree(root))


class RssWatch:
    """Polls the peak RSS (VmHWM) of every process in a tree, and counts the
    CPU time the tree spends between ``start`` and ``stop`` (``cpu_s``)."""

    def __init__(self, root: int, interval: float = 0.2) -> None:
        self.root, self.interval = root, interval
        self.peaks: dict[int, int] = {}
        self.peak_pss = 0     # sampled: the kernel keeps no peak of the proportional set size
        self.reset_ok = True
        self.cpu_s = 0.0
        self._cpu_start = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _poll(self) -> None:
        pss = 0
        for pid in process_tree(self.root):
            hwm = _status_kb(pid, "VmHWM:")
            if hwm is not None and hwm > self.peaks.get(pid, 0):
                self.peaks[pid] = hwm
            pss += _pss(pid)
        self.peak_pss = max(self.peak_pss, pss)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._poll()

    def start(self) -> None:
        """Reset the kernel's peak counters and begin polling."""
        self.peaks = {}
        self.peak_pss = 0
        for pid in process_tree(self.root):
            try:
                with open(f"/proc/{pid}/clear_refs", "w") as fh:
                    fh.write("5")
            except OSError:
                self.reset_ok = False
        self._cpu_start = tree_cpu_seconds(self.root)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="rss-watch", daemon=True)
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.cpu_s = tree_cpu_seconds(self.root) - self._cpu_start
        self._poll()
        return sum(self.peaks.values())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def http_json(port: int, method: str, path: str, body=None, headers=None,
              timeout: float = 30.0) -> tuple[int, dict | None]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        return resp.status, parsed
    finally:
        conn.close()


class Server:
    """A server process started in its own session, logged to a file."""

    name = "server"

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> None:
        self.argv, self.env, self.log_path, self.cwd = argv, env, log, cwd
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(("\n$ " + shlex.join(self.argv) + "\n").encode())
        log.flush()
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def wait_ready(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status, _ = http_json(self.port, "GET", path, timeout=2.0)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # a worker left behind by a master that died first
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# --------------------------------------------------------------------------- SSE

def iter_sse(resp: http.client.HTTPResponse):
    """Yield (event, data) for each SSE message; comments are skipped."""
    event, data = None, []
    while True:
        line = resp.readline()
        if not line:
            if data:
                yield event, "\n".join(data)
            return
        line = line.rstrip(b"\r\n")
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = None, []
            continue
        if line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if name == b"event":
            event = value.decode()
        elif name == b"data":
            data.append(value.decode("utf-8", "replace"))


class Protocol:
    """How to ask one server for a streamed completion and read its answer."""

    path = "/"

    def body(self, index: int, prompt: str, cfg: "LoadConfig", history: list[dict] = ()) -> dict:
        """The request for ``prompt``, a user message after the conversation ``history``."""
        raise NotImplementedError

    def on_event(self, event: str | None, data: str, st: dict) -> tuple[int, bool]:
        """Returns (output tokens this event carries, or -1 when it carries text
        but does not say how many; stream finished). Output text goes to st["text"]."""
        raise NotImplementedError


def _messages(prompt: str, history) -> list[dict]:
    return [*history, {"role": "user", "content": prompt}]


def _add_text(st: dict, text: str | None) -> None:
    if text:
        st["text"] = st.get("text", "") + text


def _sampling(cfg: "LoadConfig") -> dict:
    return {"temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": 1.0, "seed": None}


class ResponsesProtocol(Protocol):
    """``POST /v1/responses`` with ``stream: true`` (LMSP B.5; llama-server has it too)."""

    path = "/v1/responses"

    def __init__(self, model_id: str, extra: dict | None = None) -> None:
        self.model_id, self.extra = model_id, dict(extra or {})

    def body(self, index, prompt, cfg, history=()):
        given = _messages(prompt, history) if history else prompt
        body = {"model": self.model_id, "input": given, "max_output_tokens": cfg.max_tokens,
                "stream": True, **_sampling(cfg)}
        body["seed"] = cfg.seed + index
        body.update(self.extra)
        return body

    def on_event(self, event, data, st):
        if event is None and data.startswith("{"):
            event = json.loads(data).get("type")
        if event == "response.output_text.delta":
            _add_text(st, json.loads(data).get("delta"))
            return -1, False
        if event in ("response.completed", "response.incomplete"):
            usage = (json.loads(data).get("response") or {}).get("usage") or {}
            st["output_tokens"] = int(usage.get("output_tokens") or 0)
            st["input_tokens"] = int(usage.get("input_tokens") or 0)
            st["ok"] = True
            return 0, True
        if event in ("response.failed", "response.cancelled", "error"):
            st["error"] = f"{event}: {data[:200]}"
            return 0, True
        return 0, False


class CompletionProtocol(Protocol):
    """llama-server's native ``POST /completion``, fed the chat-templated prompt
    that its own chat endpoints would build (from ``/apply-template``)."""

    path = "/completion"

    def __init__(self, port: int) -> None:
        self.port = port
        self._templated: dict[str, str] = {}

    @staticmethod
    def key(prompt: str, history=()) -> str:
        return json.dumps(_messages(prompt, history))

    def prepare(self, prompt: str, history=()) -> None:
        key = self.key(prompt, history)
        if key in self._templated:
            return
        status, out = http_json(self.port, "POST", "/apply-template", {"messages": _messages(prompt, history)})
        if status != 200 or not out or "prompt" not in out:
            raise RuntimeError(f"llama-server /apply-template answered {status}: {out}")
        self._templated[key] = out["prompt"]

    def body(self, index, prompt, cfg, history=()):
        templated = self._templated[self.key(prompt, history)]
        body = {"prompt": templated, "n_predict": cfg.max_tokens, "stream": True,
                "ignore_eos": True, "min_p": 0.0, **_sampling(cfg)}
        body["seed"] = cfg.seed + index
        if not cfg.llama_prompt_cache:
            body["cache_prompt"] = False
        return body

    def on_event(self, event, data, st):
        msg = json.loads(data)
        _add_text(st, msg.get("content"))
        n = int(msg.get("tokens_predicted") or 0)
        carried = n - st.get("n_prev", 0)
        st["n_prev"] = n
        if msg.get("stop"):
            st["output_tokens"] = n
            st["input_tokens"] = int(msg.get("tokens_evaluated") or 0)
            st["ok"] = True
            return (carried if msg.get("content") else 0), True
        return (carried if msg.get("content") else 0), False


class ChatProtocol(Protocol):
    """OpenAI's ``POST /v1/chat/completions``: llama-server's (with its own fields), or
    the service's (``model_id`` named, OpenAI's fields and ``top_k``)."""

    path = "/v1/chat/completions"

    def __init__(self, model_id: str | None = None, *, llama: bool = True) -> None:
        self.model_id, self.llama = model_id, llama

    def body(self, index, prompt, cfg, history=()):
        body = {"messages": _messages(prompt, history), "max_tokens": cfg.max_tokens,
                "stream": True, "stream_options": {"include_usage": True}, **_sampling(cfg)}
        body["seed"] = cfg.seed + index
        if self.model_id is not None:
            body["model"] = self.model_id
        if self.llama:
            body.update(ignore_eos=True, min_p=0.0)
            if not cfg.llama_prompt_cache:
                body["cache_prompt"] = False
        return body

    def on_event(self, event, data, st):
        if data.strip() == "[DONE]":
            st["ok"] = "output_tokens" in st
            if not st["ok"]:
                st["error"] = "stream ended without usage"
            return 0, True
        msg = json.loads(data)
        if msg.get("usage"):
            st["output_tokens"] = int(msg["usage"].get("completion_tokens") or 0)
            st["input_tokens"] = int(msg["usage"].get("prompt_tokens") or 0)
        for choice in msg.get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                _add_text(st, choice["delta"]["content"])
                return -1, False
        return 0, False


# --------------------------------------------------------------------------- load

@dataclass(frozen=True)
class LoadConfig:
    max_tokens: int = 64
    prompt_words: int = 24
    shared_words: int = 0   # words every prompt begins with
    turns: int = 1          # requests per conversation, each repeating the ones before with their answers
    temperature: float = 1.0
    top_k: int = 40
    seed: int = 1000
    timeout: float = 600.0
    llama_prompt_cache: bool = False  # llama-server's reuse of a slot's cached prompt prefix


def one_request(port: int, proto: Protocol, headers: dict, index: int, cfg: LoadConfig,
                history: list[dict] = ()) -> RequestResult:
    """Request ``index``, a user message after ``history`` (the conversation so far)."""
    res = RequestResult()
    prompt = make_prompt(index, cfg.prompt_words, 0 if history else cfg.shared_words)
    if history and isinstance(proto, CompletionProtocol):
        proto.prepare(prompt, history)  # llama-server renders the conversation: not timed
    body = json.dumps(proto.body(index, prompt, cfg, history)).encode()
    hdrs = {"Content-Type": "application/json", "Accept": "text/event-stream", **headers}
    st: dict = {}
    times: list[tuple[float, int]] = []   # (arrival, tokens carried or -1)
    res.t_start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=cfg.timeout)
    try:
        conn.request("POST", proto.path, body=body, headers=hdrs)
        resp = conn.getresponse()
        if resp.status != 200:
            res.error = f"HTTP {resp.status}: {resp.read(300).decode('utf-8', 'replace')}"
            return res
        finished = False
        for event, data in iter_sse(resp):
            carried, finished = proto.on_event(event, data, st)
            if carried:
                times.append((time.perf_counter(), carried))
            if finished:
                break
        if not finished:
            res.error = "stream ended before its terminal event"
        elif not st.get("ok"):
            res.error = st.get("error") or "failed"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        res.t_end = time.perf_counter()
        conn.close()
    res.ok = res.error is None
    res.output_tokens = int(st.get("output_tokens") or 0)
    res.input_tokens = int(st.get("input_tokens") or 0)
    res.text = st.get("text", "")
    res.text_events = len(times)
    if times:
        res.ttft = times[0][0] - res.t_start
        # events that do not say how many tokens they carry share the total evenly
        unknown = [c for _, c in times if c < 0]
        per_unknown = 1.0
        if unknown:
            known = sum(c for _, c in times if c > 0)
            per_unknown = max(1.0, (res.output_tokens - known) / len(unknown))
        for (t0, _), (t1, c) in zip(times, times[1:]):
            k = per_unknown if c < 0 else c
            res.gaps.extend([(t1 - t0) / k] * max(1, round(k)))
            res.event_gaps.append(t1 - t0)
    return res


def run_level(port: int, proto: Protocol, headers: dict, clients: int, n_requests: int,
              cfg: LoadConfig, first_index: int) -> list[RequestResult]:
    """``clients`` threads, each sending its share of ``n_requests`` one after another;
    with ``cfg.turns`` > 1, in conversations of that many requests (request
    ``first_index + t`` of a conversation starting at ``first_index``...)."""
    results: list[RequestResult] = []
    lock = threading.Lock()
    turns = max(1, cfg.turns)
    counter = iter(range(first_index, first_index + n_requests, turns))
    start = threading.Barrier(clients)

    def client() -> None:
        start.wait()
        while True:
            with lock:
                first = next(counter, None)
            if first is None:
                return
            history: list[dict] = []
            for index in range(first, first + turns):
                r = one_request(port, proto, headers, index, cfg, history)
                with lock:
                    results.append(r)
                if not r.ok:
                    break
                history = [*history, {"role": "user", "content": make_prompt(
                    index, cfg.prompt_words, 0 if history else cfg.shared_words)},
                    {"role": "assistant", "content": r.text}]

    threads = [threading.Thread(target=client, name=f"client-{i}") for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


# --------------------------------------------------------------------------- servers

@dataclass(frozen=True)
class ServeSettings:
    threads: int
    parallel: int
    ctx_per_seq: int
    n_gpu_layers: int
    ready_timeout: float = 300.0


def lmsp_command(explicit: str | None) -> list[str]:
    if explicit:
        return shlex.split(explicit)
    venv = ROOT / ".venv" / "bin" / "lmsp"
    if venv.exists():
        return [str(venv)]
    found = shutil.which("lmsp")
    if found:
        return [found]
    return [sys.executable, "-m", "lmsp.cli"]


class LlamaServer(Server):
    name = "llama-server"

    @classmethod
    def create(cls, binary: Path, model: Path, s: ServeSettings, work: Path, extra: list[str]):
        port = free_port()
        argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                "-t", str(s.threads), "-tb", str(s.threads), "--parallel", str(s.parallel),
                "-c", str(s.ctx_per_seq * s.parallel), "--no-kv-unified", "-ngl", str(s.n_gpu_layers),
                # lmsp's batch (n_batch = n_ubatch = 512); flash attention as lmsp has it:
                # on for the CPU, off with layers on a GPU (csrc/batch_plan.cpp)
                "-b", "512", "-ub", "512", "-fa", "off" if s.n_gpu_layers else "on",
                "--no-webui", "--cache-ram", "0", "--log-disable", *extra]
        srv = cls(argv, dict(os.environ), work / "logs" / f"llama-{model.stem}.log", work)
        srv.port = port
        return srv

    def ready(self, s: ServeSettings) -> None:
        self.wait_ready("/health", s.ready_timeout)


def is_variant(name: str) -> bool:
    return name == "llama" or name in LMSP_VARIANT_ENV or window_variant(name) is not None


def window_variant(name: str) -> str | None:
    """N of ``lmsp-windowN`` (a commit window of N ms), else None."""
    n = name.removeprefix("lmsp-window")
    return n if name.startswith("lmsp-window") and n.replace(".", "", 1).isdigit() else None


def variant_env(name: str) -> dict[str, str]:
    window = window_variant(name)
    return {"LMSP_COMMIT_WINDOW_MS": window} if window is not None else LMSP_VARIANT_ENV[name]


class LmspServer(Server):
    name = "lmsp"

    @classmethod
    def create(cls, cmd: list[str], model: Path, s: ServeSettings, work: Path, variant: str,
               extra_env: dict[str, str]):
        port = free_port()
        data_dir = work / "data" / f"{variant}-{model.stem}"
        if data_dir.exists():
            shutil.rmtree(data_dir)
        data_dir.mkdir(parents=True)
        env = dict(os.environ)
        env.update({
            "LMSP_N_THREADS": str(s.threads), "LMSP_N_PARALLEL": str(s.parallel),
            "LMSP_N_CTX": str(s.ctx_per_seq), "LMSP_N_GPU_LAYERS": str(s.n_gpu_layers),
            "LMSP_WORKERS": "1", "LMSP_LOG_LEVEL": "warning",
        })
        env.update(variant_env(variant))
        env.update(extra_env)
        argv = [*cmd, "serve", "--data-dir", str(data_dir), "--bind", f"127.0.0.1:{port}",
                "--model", str(model)]
        srv = cls(argv, env, work / "logs" / f"{variant}-{model.stem}.log", work)
        srv.port, srv.cmd, srv.data_dir, srv.name = port, cmd, data_dir, variant
        return srv

    def ready(self, s: ServeSettings) -> None:
        self.wait_ready("/readyz", s.ready_timeout)

    def pair(self) -> str:
        out = subprocess.run([*self.cmd, "pair", "--data-dir", str(self.data_dir), "--scopes",
                              LMSP_SCOPES, "--json"], env=self.env, capture_output=True,
                             text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"lmsp pair failed ({out.returncode}): {out.stderr.strip()}")
        code = json.loads(out.stdout)["code"]
        status, body = http_json(self.port, "POST", "/v1/pair",
                                 {"code": code, "client_name": "bench-serve"})
        if status not in (200, 201) or not body or "token" not in body:
            raise RuntimeError(f"POST /v1/pair answered {status}: {body}")
        return body["token"]


# --------------------------------------------------------------------------- report

GOALS_TEXT = """Goals (ratio lmsp / llama-server in the same run; with several rounds, tok/s, TTFT and
CPU per token are the median of each round's ratio to llama-server's round, RSS the median round's):
  tok/s >= 1.0 at every level, and no failed request; TTFT p50 <= 1.05 at 1 and 4 clients;
  CPU time per output token <= 1.0; peak PSS <= llama-server's + 40 MB;
  persistence on costs <= 5% tok/s against lmsp-memevents (and, an upper bound, lmsp-noevents)."""


def fmt(v, nd=1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def ratio(a, b) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def markdown_table(levels: list[LevelResult]) -> str:
    head = ("| model | server | clients | reqs | failed | short | in tok | tok/s | TTFT p50 ms | TTFT p99 ms "
            "| ITL p50 ms | ITL p99 ms | event gap p50 ms | event gap p99 ms | tok/event | CPU ms/tok "
            "| peak RSS MB | peak PSS MB | load |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in levels:
        lines.append(f"| {r.model} | {r.server} | {r.clients} | {r.requests} | {r.failed} | {r.short_outputs} "
                     f"| {fmt(r.mean_input_tokens)} | {fmt(r.tok_s)} | {fmt(r.ttft_p50_ms)} | {fmt(r.ttft_p99_ms)} "
                     f"| {fmt(r.itl_p50_ms, 2)} | {fmt(r.itl_p99_ms, 2)} | {fmt(r.event_gap_p50_ms, 2)} "
                     f"| {fmt(r.event_gap_p99_ms, 2)} | {fmt(r.tokens_per_event, 2)} "
                     f"| {fmt(r.cpu_ms_per_token, 3)} | {fmt(r.peak_rss_mb)} | {fmt(r.peak_pss_mb)} "
                     f"| {fmt(r.load_avg, 2)} |")
    return "\n".join(lines)


def ratio_rows(levels: list[LevelResult]) -> list[dict]:
    base = {(r.model, r.clients): r for r in levels if r.server == "llama"}
    rows = []
    for r in levels:
        if r.server == "llama" or (r.model, r.clients) not in base:
            continue
        b = base[(r.model, r.clients)]
        rss_delta = None if r.peak_rss_mb is None or b.peak_rss_mb is None else r.peak_rss_mb - b.peak_rss_mb
        pss_delta = None if r.peak_pss_mb is None or b.peak_pss_mb is None else r.peak_pss_mb - b.peak_pss_mb
        rows.append({
            "model": r.model, "server": r.server, "clients": r.clients,
            "tok_s": ratio(r.tok_s, b.tok_s), "ttft_p50": ratio(r.ttft_p50_ms, b.ttft_p50_ms),
            "ttft_p99": ratio(r.ttft_p99_ms, b.ttft_p99_ms), "itl_p50": ratio(r.itl_p50_ms, b.itl_p50_ms),
            "itl_p99": ratio(r.itl_p99_ms, b.itl_p99_ms),
            "event_gap_p50": ratio(r.event_gap_p50_ms, b.event_gap_p50_ms),
            "event_gap_p99": ratio(r.event_gap_p99_ms, b.event_gap_p99_ms),
            "rss_delta_mb": rss_delta, "pss_delta_mb": pss_delta,
            "cpu_per_token": ratio(r.cpu_ms_per_token, b.cpu_ms_per_token),
            "failed": r.failed, "failed_llama": b.failed,
        })
    return rows


def ratio_table(rows: list[dict]) -> str:
    lines = ["| model | server | clients | tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | event gap p50 "
             "| event gap p99 | CPU/tok | RSS - llama MB | PSS - llama MB | failed (llama) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in rows:
        lines.append(f"| {x['model']} | {x['server']} | {x['clients']} | {fmt(x['tok_s'], 2)} "
                     f"| {fmt(x['ttft_p50'], 2)} | {fmt(x['ttft_p99'], 2)} | {fmt(x['itl_p50'], 2)} "
                     f"| {fmt(x['itl_p99'], 2)} | {fmt(x.get('event_gap_p50'), 2)} "
                     f"| {fmt(x.get('event_gap_p99'), 2)} | {fmt(x.get('cpu_per_token'), 2)} "
                     f"| {fmt(x['rss_delta_mb'])} | {fmt(x.get('pss_delta_mb'))} "
                     f"| {x['failed']} ({x['failed_llama']}) |")
    return "\n".join(lines)


def goal_checks(levels: list[LevelResult], rounds: list[LevelResult] | None = None) -> list[str]:
    """The goals on the median rounds ``levels``; given every round, on the paired ratios."""
    out = []
    rows = [x for x in ratio_rows(levels) if x["server"] == "lmsp"]
    paired = paired_ratios(rounds) if rounds else {}
    for x in rows:
        x = {**x, **{k: v for k, v in paired.get((x["model"], x["server"], x["clients"]), {}).items()
                     if k != "rounds"}}
        tag = f"{x['model']} {x['clients']}c"
        out.append(_check(f"{tag} tok/s ratio >= 1.0", x["tok_s"], lambda v: v >= 1.0))
        if x["clients"] <= 4:
            out.append(_check(f"{tag} TTFT p50 ratio <= 1.05", x["ttft_p50"], lambda v: v <= 1.05))
        out.append(_check(f"{tag} CPU per token ratio <= 1.0", x["cpu_per_token"], lambda v: v <= 1.0))
        out.append(_check(f"{tag} PSS - llama <= 40 MB", x.get("pss_delta_mb"), lambda v: v <= 40))
        out.append(_check(f"{tag} failed == 0", x["failed"], lambda v: v == 0))
    on = {(r.model, r.clients): r for r in levels if r.server == "lmsp"}
    for r in levels:
        if r.server in ("lmsp-memevents", "lmsp-noevents") and (r.model, r.clients) in on:
            cost = None if not r.tok_s else 1.0 - on[(r.model, r.clients)].tok_s / r.tok_s
            against = "streamed from memory" if r.server == "lmsp-memevents" else "no streaming, upper bound"
            out.append(_check(f"{r.model} {r.clients}c persistence cost <= 5% ({against})", cost,
                              lambda v: v <= 0.05))
    return out


def _check(label: str, value, ok) -> str:
    if value is None:
        return f"  n/a   {label}"
    shown = f"{value:.3f}" if isinstance(value, float) else str(value)
    return f"  {'PASS' if ok(value) else 'MISS'}  {label}: {shown}"


def machine_line() -> str:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as fh:
            total = int(fh.readline().split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        total = 0
    return f"{cpu}, {os.cpu_count()} logical CPUs, {total} MiB RAM, {platform.system()} {platform.release()}"


# --------------------------------------------------------------------------- driver

def make_models(names: list[str], files: list[str], work: Path) -> list[Path]:
    """Catalog models (fetched into the cache), demo presets (written under WORK) and files."""
    return [m.path for m in resolve(names, files, work / "models")]


# A model without a chat template: the service renders messages as
# "User: ...\n\nAssistant:" (csrc/engine.cpp, fallback_template); llama-server
# would fall back to another format. It gets the same one as a Jinja template,
# so that both tokenize the same text.
PLAIN_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}System"
    "{%- elif message['role'] == 'assistant' -%}Assistant"
    "{%- else -%}User{%- endif -%}"
    ": {{ message['content'] }}\n\n"
    "{% endfor -%}"
    "{%- if add_generation_prompt -%}Assistant:{%- endif -%}")


def llama_template_args(model: Path, work: Path) -> list[str]:
    """llama-server's arguments for the service's plain format where the model has no template."""
    if has_chat_template(model):
        return []
    path = work / "plain-chat-template.jinja"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PLAIN_CHAT_TEMPLATE)
    return ["--chat-template-file", str(path)]


class Profiler:
    """Samples the busiest process of a server tree while one level runs.

    ``py-spy``: Python stacks of every thread, idle ones too (``--idle``), as
    collapsed stacks (one line per stack, count last). ``perf``: ``perf
    record -g`` of the whole process (C, C++ and the interpreter), summarized
    afterwards by shared object and by symbol. Both are stopped with SIGINT
    when the level ends.
    """

    def __init__(self, kind: str, out_dir: Path) -> None:
        self.kind, self.out_dir = kind, out_dir
        self.proc: subprocess.Popen | None = None
        self.path: Path | None = None

    @staticmethod
    def busiest(root: int) -> int:
        """The process of the tree with the largest resident set: the worker that holds the model."""
        return max(process_tree(root), key=lambda pid: _status_kb(pid, "VmRSS:") or 0)

    def start(self, root: int, label: str) -> None:
        pid = self.busiest(root)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.kind == "py-spy":
            self.path = self.out_dir / f"{label}.pyspy.txt"
            argv = ["py-spy", "record", "-p", str(pid), "-r", "200", "-f", "raw", "--threads", "--idle",
                    "-o", str(self.path)]
            exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
            argv[0] = exe
        else:
            self.path = self.out_dir / f"{label}.perf.data"
            argv = ["perf", "record", "-F", "499", "-g", "-p", str(pid), "-o", str(self.path)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)   # let it attach before the load starts

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.kind == "perf" and self.path and self.path.exists():
            for sort in ("dso", "sym"):
                report = subprocess.run(["perf", "report", "-i", str(self.path), "--stdio", "--no-children",
                                         "--sort", sort, "-g", "none", "--percent-limit", "0.5"],
                                        capture_output=True, text=True)
                self.path.with_suffix(f".{sort}.txt").write_text(report.stdout)
        print(f"    profile: {self.path}", flush=True)
        self.proc = None


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
    return ResponsesProtocol(model_id, {"ignore_eos": True, "min_p": 0.0, "cache_prompt": cfg.llama_prompt_cache})


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


def median_rounds(levels: list[LevelResult]) -> list[LevelResult]:
    """Per (model, server, clients), the round whose tok/s is the median (the lower one of two)."""
    groups: dict[tuple, list[LevelResult]] = {}
    for lvl in levels:
        groups.setdefault((lvl.model, lvl.server, lvl.clients), []).append(lvl)
    out = []
    for group in groups.values():
        ranked = sorted(group, key=lambda x: x.tok_s)
        # failures lower tok/s, so the median round tends to be one without: the row
        # counts the requests and failures of every round, and its errors
        pick = ranked[(len(ranked) - 1) // 2]
        out.append(dataclasses.replace(pick, requests=sum(x.requests for x in group),
                                       failed=sum(x.failed for x in group),
                                       errors=sorted({e for x in group for e in x.errors})))
    return out


def round_stats(levels: list[LevelResult]) -> list[dict]:
    """Per (model, server, clients): tok/s over the rounds (mean, standard deviation,
    least, most). On a small shared machine the rounds of one level spread by more
    than a 5% goal, and the mean uses every round where the median picks one."""
    groups: dict[tuple, list[float]] = {}
    for lvl in levels:
        if lvl.tok_s is not None:
            groups.setdefault((lvl.model, lvl.server, lvl.clients), []).append(lvl.tok_s)
    out = []
    for (model, server, clients), values in groups.items():
        mean = statistics.fmean(values)
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        out.append({"model": model, "server": server, "clients": clients, "rounds": len(values),
                    "tok_s_mean": mean, "tok_s_std": std, "tok_s_min": min(values), "tok_s_max": max(values)})
    return out


def round_stats_table(stats: list[dict]) -> str:
    lines = ["| model | server | clients | rounds | tok/s mean | std | least | most |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in stats:
        lines.append(f"| {x['model']} | {x['server']} | {x['clients']} | {x['rounds']} | {x['tok_s_mean']:.1f} "
                     f"| {x['tok_s_std']:.1f} | {x['tok_s_min']:.1f} | {x['tok_s_max']:.1f} |")
    return "\n".join(lines)


def persistence_on_means(stats: list[dict]) -> list[str]:
    """The persistence goal read on the means of the rounds."""
    on = {(x["model"], x["clients"]): x for x in stats if x["server"] == "lmsp"}
    out = []
    for x in stats:
        if x["server"] in ("lmsp-memevents", "lmsp-noevents") and (x["model"], x["clients"]) in on:
            cost = 1.0 - on[(x["model"], x["clients"])]["tok_s_mean"] / x["tok_s_mean"] if x["tok_s_mean"] else None
            out.append(_check(f"{x['model']} {x['clients']}c persistence cost <= 5% against {x['server']}, "
                              f"means of {x['rounds']} rounds", cost, lambda v: v <= 0.05))
    return out


def model_record(levels: list[LevelResult], args, commands: dict, s: "ServeSettings", cfg: LoadConfig) -> dict:
    """One model's figures for bench/results: medians, ratios, goal checks, every round."""
    summary = median_rounds(levels)
    model = levels[0].model
    return {
        "command": shlex.join([sys.executable, *sys.argv]), "rounds": args.rounds,
        "settings": asdict(s), "load": asdict(cfg), "llama_endpoint": args.llama_endpoint, "api": args.api,
        "server_commands": {k: v for k, v in commands.items() if k.endswith(f" {model}")},
        "prompt_tokens": {r.server: r.mean_input_tokens for r in summary
                          if r.clients == min(x.clients for x in summary)},
        "levels": [asdict(x) for x in summary], "ratios": ratio_rows(summary),
        "paired_ratios": [{"model": k[0], "server": k[1], "clients": k[2], **v}
                          for k, v in sorted(paired_ratios(levels).items())],
        "goals": [line.strip() for line in goal_checks(summary, levels if args.rounds > 1 else None)],
        "over_rounds": round_stats(levels), "all_rounds": [asdict(x) for x in levels],
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--models", default=DEFAULT_MODELS,
                   help="catalog models (fetched into the cache) or demo presets (comma list; '' for none). "
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
    p.add_argument("--results-dir", type=lambda v: Path(v) if v else None, default=DEFAULT_RESULTS,
                   help="also write one record per model here, serve-MODEL-DATE.json ('' for none)")
    p.add_argument("--profile", choices=("py-spy", "perf"), default=None,
                   help="sample each server's busiest process during every level (files in WORK/profiles)")
    p.add_argument("--quick", action="store_true",
                   help="tiny model only, 32 output tokens, fewest requests: a smoke run")
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


def _exit_on_term(signum, frame) -> None:
    raise SystemExit(128 + signum)   # unwinds through the finally blocks that stop the servers


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_term)
    variants = [v for v in args.servers.split(",") if v]
    for v in variants:
        if not is_variant(v):
            raise SystemExit(f"unknown server {v!r}; known: {', '.join(VARIANTS)}")
    clients_list = [int(c) for c in args.clients.split(",") if c]
    if not clients_list or min(clients_list) < 1:
        raise SystemExit("--clients needs positive integers")
    if "llama" in variants and not args.llama_server.is_file():
        raise SystemExit(f"{args.llama_server} not found: run bench/build_reference.sh first "
                         "(or pass --llama-server, or leave llama out of --servers)")
    raise_fd_limit()
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    cfg = LoadConfig(max_tokens=args.max_tokens, prompt_words=args.prompt_words, shared_words=args.shared_words,
                     turns=max(1, args.turns),
                     temperature=args.temperature, top_k=args.top_k, seed=args.seed,
                     llama_prompt_cache=args.llama_prompt_cache)
    # words of a conversation's last request (about 8 more a question around its own
    # words, an earlier answer counted as its tokens), at most 3 tokens a word
    turns = max(1, args.turns)
    words = (args.prompt_words + 8) * turns + args.shared_words + args.max_tokens * (turns - 1)
    ctx = args.ctx or max(256, 2 ** math.ceil(math.log2(words * 3 + 64 + args.max_tokens)))
    s = ServeSettings(threads=args.threads, parallel=args.parallel or max(clients_list),
                      ctx_per_seq=ctx, n_gpu_layers=args.n_gpu_layers)
    models = make_models([m for m in args.models.split(",") if m], args.model_file, work)
    print(f"machine: {machine_line()}")
    print(f"settings: threads={s.threads} parallel={s.parallel} ctx/seq={s.ctx_per_seq} "
          f"ngl={s.n_gpu_layers} max_tokens={cfg.max_tokens} temperature={cfg.temperature} top_k={cfg.top_k} "
          f"llama endpoint={args.llama_endpoint} prompt caches={args.llama_prompt_cache} "
          f"shared words={cfg.shared_words} turns={cfg.turns}", flush=True)
    levels: list[LevelResult] = []
    commands: dict[str, str] = {}
    out = args.json or work / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        """Written after every server too, so a run cut short keeps what it measured."""
        out.write_text(json.dumps({
            "machine": machine_line(), "argv": sys.argv, "settings": asdict(s), "load": asdict(cfg),
            "llama_endpoint": args.llama_endpoint, "api": args.api, "commands": commands,
            "rounds": args.rounds, "levels": [asdict(x) for x in median_rounds(levels)],
            "ratios": ratio_rows(median_rounds(levels)), "all_rounds": [asdict(x) for x in levels],
            "over_rounds": round_stats(levels),
        }, indent=2))
    lmsp_cmd = lmsp_command(args.lmsp)
    source = git_state()  # the code measured: as the run starts
    missed: list[str] = []  # levels of a server that had died (or did not start): failures too
    for model in models:
        print(f"model {model.name} ({model.stat().st_size / 1e6:.1f} MB)", flush=True)
        running: list[Contender] = []
        try:
            for variant in variants:
                try:
                    running.append(open_contender(variant, model, args, cfg, s, work, lmsp_cmd, commands))
                except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as exc:
                    print(f"  {variant} on {model.name} did not start: {exc}", flush=True)
                    missed.append(f"{variant} on {model.name}: did not start")
            index = 0
            for clients in clients_list:
                n = max(args.min_requests, clients * args.requests_per_client)
                for rnd in range(args.rounds):
                    # alternate the order, so that no server always goes first after a pause
                    for c in (running if rnd % 2 == 0 else running[::-1]):
                        if not c.srv.alive():
                            missed.append(f"{c.variant} on {model.name}, {clients} clients, round {rnd + 1}")
                            continue
                        # the same request indices (prompts, seeds) for every server
                        prof = Profiler(args.profile, work / "profiles") if args.profile else None
                        levels.append(measure(c, model, clients, n, index, cfg, rnd, prof))
                    index += n
                save()
        finally:
            for c in running:
                c.srv.stop()
            save()
        if args.results_dir is not None:
            mine = [x for x in levels if x.model == model.stem]
            if mine:
                path = write_model_results(args.results_dir, model.stem, model_record(mine, args, commands, s, cfg),
                                           source=source)
                print(f"  record: {path}", flush=True)
    summary = median_rounds(levels)
    print()
    if args.rounds > 1:
        print(f"each row: the median of {args.rounds} rounds by tok/s")
    print(markdown_table(summary))
    rows = ratio_rows(summary)
    if rows:
        print()
        print(ratio_table(rows))
        print()
        if args.rounds > 1:
            print("\nratios paired by round (the median of each round's ratio to llama-server's):")
            print(paired_table(paired_ratios(levels)))
        print()
        print(GOALS_TEXT)
        print("\n".join(goal_checks(summary, levels if args.rounds > 1 else None)))
    if args.rounds > 1:
        stats = round_stats(levels)
        print(f"\ntok/s over the {args.rounds} rounds:")
        print(round_stats_table(stats))
        checks = persistence_on_means(stats)
        if checks:
            print("\n".join(checks))
    for what in missed:
        print(f"  MISS  not measured, the server was not running: {what}")
    save()
    print(f"\nresults: {out}")
    failed = sum(x.failed for x in levels)
    return 1 if failed or missed or not levels else 0


if __name__ == "__main__":
    sys.exit(main())
