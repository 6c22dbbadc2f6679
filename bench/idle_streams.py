#!/usr/bin/env python3
"""One gevent worker holding many idle SSE streams while others are active.

    python bench/idle_streams.py                       # 500 idle + 64 active
    python bench/idle_streams.py --idle 100 --active 16

What it does, against one ``lmsp serve`` (one worker) on the tiny demo model:
1. opens ``--active`` streamed requests (``POST /v1/responses``, ``stream:
   true``) that keep the engine busy;
2. once every active stream has its first event, creates ``--idle``
   background responses, which queue behind them, and follows each one with
   ``GET /v1/responses/{id}?stream=true``: these streams sit idle, getting only
   heartbeats, while the active ones run;
3. when the active streams are done (and ``--hold`` seconds more), cancels the
   idle responses, so that every idle stream must end with its terminal event.

A stream counts as good when it answered 200, its SSE ids go up by exactly 1,
and it ended with a terminal event (completed, incomplete or cancelled). The
script prints the counts, the heartbeats seen, the worker's peak RSS and every
error, and exits non-zero on any error.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving.load import make_prompt  # noqa: E402
from serving.procs import exit_on_term, raise_fd_limit, RssWatch  # noqa: E402
from serving.servers import ROOT, lmsp_command, LmspServer, make_models, ServeSettings  # noqa: E402
from serving.sse import http_json  # noqa: E402

TERMINAL = ("response.completed", "response.incomplete", "response.cancelled", "response.failed")


@dataclass
class Stream:
    kind: str
    response_id: str | None = None
    status: int = 0
    events: int = 0
    heartbeats: int = 0
    last_id: int | None = None
    terminal: str | None = None
    error: str | None = None
    first_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def good(self) -> bool:
        return self.error is None and self.terminal in ("response.completed", "response.incomplete",
                                                        "response.cancelled")


def read_stream(resp: http.client.HTTPResponse, st: Stream) -> None:
    """Read SSE frames, checking ids, until the terminal event."""
    ev_id, ev_type = None, None
    while True:
        line = resp.readline()
        if not line:
            if st.terminal is None:
                st.error = st.error or "stream closed before a terminal event"
            return
        line = line.rstrip(b"\r\n")
        if line.startswith(b":"):
            st.heartbeats += 1
            continue
        if line.startswith(b"id:"):
            ev_id = int(line[3:].strip())
        elif line.startswith(b"event:"):
            ev_type = line[6:].strip().decode()
        elif line.startswith(b"data:") and ev_type is None:
            try:
                ev_type = json.loads(line[5:]).get("type")
            except ValueError:
                pass
        elif not line and ev_type is not None:
            st.events += 1
            st.first_event.set()
            if ev_id is not None:
                if st.last_id is not None and ev_id != st.last_id + 1:
                    st.error = f"sequence went from {st.last_id} to {ev_id}"
                st.last_id = ev_id
            if ev_type in TERMINAL:
                st.terminal = ev_type
                if ev_type == "response.failed":
                    st.error = "response.failed"
                return
            ev_id, ev_type = None, None


class OpenCount:
    """How many streams are open now, and the most that were open at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = self.peak = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.now += n
            self.peak = max(self.peak, self.now)


OPEN = OpenCount()


def run_stream(port: int, method: str, path: str, headers: dict, body: dict | None, st: Stream,
               timeout: float) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Accept": "text/event-stream", **headers}
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        st.status = resp.status
        if resp.status != 200:
            st.error = f"HTTP {resp.status}: {resp.read(300).decode('utf-8', 'replace')}"
            return
        OPEN.add(1)
        try:
            read_stream(resp, st)
        finally:
            OPEN.add(-1)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        st.error = f"{type(exc).__name__}: {exc}"
    finally:
        st.first_event.set()
        conn.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--idle", type=int, default=500)
    p.add_argument("--active", type=int, default=64)
    p.add_argument("--active-tokens", type=int, default=512, help="output tokens per active request")
    p.add_argument("--idle-tokens", type=int, default=8, help="max_output_tokens of the idle responses")
    p.add_argument("--parallel", type=int, default=64, help="sequences decoded together")
    p.add_argument("--threads", type=int, default=0, help="engine threads (0: all cores)")
    p.add_argument("--heartbeat", type=float, default=2.0, help="LMSP_HEARTBEAT_SECONDS for the run")
    p.add_argument("--hold", type=float, default=3.0, help="seconds to hold the idle streams after the active end")
    p.add_argument("--model", default="tiny", help="a demo shape of bench/bench_models.py or a catalog model")
    p.add_argument("--lmsp", default=None, help="command that runs the lmsp CLI")
    p.add_argument("--work-dir", type=Path, default=ROOT / "bench" / "out" / "idle")
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, exit_on_term)

    raise_fd_limit()
    work = args.work_dir.resolve()
    model = make_models([args.model], [], work)[0]
    s = ServeSettings(threads=args.threads or (os.cpu_count() or 1), parallel=args.parallel,
                            ctx_per_seq=512, n_gpu_layers=0)
    srv = LmspServer.create(lmsp_command(args.lmsp), model, s, work, "lmsp",
                                  {"LMSP_HEARTBEAT_SECONDS": str(args.heartbeat),
                                   "LMSP_MAX_UNFINISHED_PER_CLIENT": "0"})  # one client queues them all
    threading.stack_size(256 * 1024)
    streams: list[Stream] = []
    t0 = time.monotonic()
    try:
        srv.start()
        srv.ready(s)
        auth = {"Authorization": f"Bearer {srv.pair()}"}
        watch = RssWatch(srv.proc.pid)
        watch.start()

        def spawn(st: Stream, method: str, path: str, body: dict | None) -> None:
            t = threading.Thread(target=run_stream, args=(srv.port, method, path, auth, body, st, args.timeout),
                                 daemon=True)
            st.thread = t
            streams.append(st)
            t.start()

        active = []
        for i in range(args.active):
            st = Stream("active")
            active.append(st)
            spawn(st, "POST", "/v1/responses", {
                "model": model.stem, "input": make_prompt(i, 16), "stream": True,
                "max_output_tokens": args.active_tokens, "temperature": 1.0, "seed": i})
        for st in active:
            st.first_event.wait(args.timeout)
        print(f"{args.active} active streams open after {time.monotonic() - t0:.1f}s", flush=True)

        idle = [Stream("idle") for _ in range(args.idle)]
        spawn_lock = threading.Lock()

        def create(i: int) -> None:
            st = idle[i]
            try:
                status, body = http_json(srv.port, "POST", "/v1/responses", {
                    "model": model.stem, "input": make_prompt(10_000 + i, 8), "background": True,
                    "max_output_tokens": args.idle_tokens, "seed": i}, headers=auth)
            except OSError as exc:
                status, body = 0, str(exc)
            with spawn_lock:
                if status not in (200, 202) or not isinstance(body, dict) or "id" not in body:
                    st.error = f"create answered {status}: {body}"
                    streams.append(st)
                    return
                st.response_id = body["id"]
                spawn(st, "GET", f"/v1/responses/{st.response_id}?stream=true", None)

        creators = [threading.Thread(target=lambda k=k: [create(i) for i in range(k, args.idle, 16)])
                    for k in range(16)]
        for t in creators:
            t.start()
        for t in creators:
            t.join()
        for st in idle:
            st.first_event.wait(args.timeout)
        active_left = sum(1 for st in active if st.terminal is None and st.error is None)
        print(f"{len(idle)} idle streams open after {time.monotonic() - t0:.1f}s, with {active_left} "
              f"active streams still running; {OPEN.now} streams open", flush=True)

        for st in active:
            st.thread.join(args.timeout)
        t_active = time.monotonic() - t0
        running_idle = sum(1 for st in idle if st.terminal is None and st.error is None)
        print(f"active streams done after {t_active:.1f}s; {running_idle} idle streams still open", flush=True)
        time.sleep(args.hold)
        cancel_errors = 0
        for st in idle:
            if st.response_id and st.terminal is None:
                status, body = http_json(srv.port, "POST", f"/v1/responses/{st.response_id}/cancel",
                                               {}, headers=auth)
                if status != 200 and not (status == 409 and body and
                                          body.get("error", {}).get("code") == "task_finished"):
                    cancel_errors += 1
                    st.error = st.error or f"cancel answered {status}: {body}"
        for st in list(streams):
            if st.thread is not None:
                st.thread.join(args.timeout)
        peak = watch.stop()
        alive = srv.alive()
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        srv.stop()

    elapsed = time.monotonic() - t0
    bad = [st for st in streams if not st.good()]
    by_kind = {}
    for st in streams:
        k = by_kind.setdefault(st.kind, {"streams": 0, "good": 0, "events": 0, "heartbeats": 0, "terminal": {}})
        k["streams"] += 1
        k["good"] += st.good()
        k["events"] += st.events
        k["heartbeats"] += st.heartbeats
        k["terminal"][st.terminal] = k["terminal"].get(st.terminal, 0) + 1
    report = {"idle": args.idle, "active": args.active, "parallel": args.parallel, "elapsed_s": round(elapsed, 1),
              "active_phase_s": round(t_active, 1), "active_running_when_idle_open": active_left,
              "idle_open_when_active_done": running_idle, "most_streams_open_at_once": OPEN.peak,
              "peak_rss_mb": round(peak / 1048576, 1), "server_alive_at_end": alive,
              "cancel_errors": cancel_errors, "by_kind": by_kind,
              "errors": sorted({st.error for st in bad if st.error})[:10]}
    print(json.dumps(report, indent=2))
    (work / "idle_streams.json").write_text(json.dumps(report, indent=2))
    return 0 if not bad and alive else 1


if __name__ == "__main__":
    sys.exit(main())
