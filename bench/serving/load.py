"""The load: fixed prompts and seeds, one streamed request timed from the client, and
a level of concurrent clients (each request after the one before, or conversations)."""
from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field

from .protocols import CompletionProtocol, Protocol
from .sse import iter_sse

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


