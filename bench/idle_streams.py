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

A stream counts as good when it answered 200, its SSE ids (the task's event
numbers, without the ``task.*`` events a response stream leaves out) go up,
and it ended with a terminal event (completed, incomplete or cancelled). The
script prints the counts, the heartbeats seen, the worker's peak RSS and every
error, and exits non-zero on any error.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_path import write_result  # noqa: E402
from serving.load import make_prompt  # noqa: E402
from serving.procs import RssWatch, exit_on_term, raise_fd_limit  # noqa: E402
from serving.servers import ROOT, LmspServer, ServeSettings, lmsp_command, make_models  # noqa: E402
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
                # the ids are the task's event numbers; a response stream skips the task.* events
                if st.last_id is not None and ev_id <= st.last_id:
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


def parse_args(argv=None) -> argparse.Namespace:
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
    p.add_argument("--out", type=Path, default=None,
                   help="the result file (default: bench/results/TIME-idle_streams-MODEL.json)")
    return p.parse_args(argv)


class Load:
    """The streams of one run against one server: the active ones, then the idle ones."""

    def __init__(self, srv, auth: dict, model: Path, args: argparse.Namespace) -> None:
        self.srv, self.auth, self.model, self.args = srv, auth, model, args
        self.streams: list[Stream] = []
        self.lock = threading.Lock()
        self.t0 = time.monotonic()

    def spawn(self, st: Stream, method: str, path: str, body: dict | None) -> None:
        t = threading.Thread(target=run_stream, daemon=True,
                             args=(self.srv.port, method, path, self.auth, body, st, self.args.timeout))
        st.thread = t
        self.streams.append(st)
        t.start()

    def open_active(self) -> list[Stream]:
        """``--active`` streamed requests, each open once its first event came."""
        active = []
        for i in range(self.args.active):
            st = Stream("active")
            active.append(st)
            self.spawn(st, "POST", "/v1/responses", {
                "model": self.model.stem, "input": make_prompt(i, 16), "stream": True,
                "max_output_tokens": self.args.active_tokens, "temperature": 1.0, "seed": i})
        for st in active:
            st.first_event.wait(self.args.timeout)
        print(f"{self.args.active} active streams open after {time.monotonic() - self.t0:.1f}s", flush=True)
        return active

    def create(self, st: Stream, i: int) -> None:
        """Background response ``i``, then its stream."""
        try:
            status, body = http_json(self.srv.port, "POST", "/v1/responses", {
                "model": self.model.stem, "input": make_prompt(10_000 + i, 8), "background": True,
                "max_output_tokens": self.args.idle_tokens, "seed": i}, headers=self.auth)
        except OSError as exc:
            status, body = 0, str(exc)
        with self.lock:
            if status not in (200, 202) or not isinstance(body, dict) or "id" not in body:
                st.error = f"create answered {status}: {body}"
                self.streams.append(st)
                return
            st.response_id = body["id"]
            self.spawn(st, "GET", f"/v1/responses/{st.response_id}?stream=true", None)

    def open_idle(self) -> list[Stream]:
        """``--idle`` background responses (16 threads create them), each followed by a stream."""
        idle = [Stream("idle") for _ in range(self.args.idle)]
        creators = [threading.Thread(target=lambda k=k: [self.create(idle[i], i) for i in range(k, len(idle), 16)])
                    for k in range(16)]
        for t in creators:
            t.start()
        for t in creators:
            t.join()
        for st in idle:
            st.first_event.wait(self.args.timeout)
        return idle

    def cancel(self, idle: list[Stream]) -> int:
        """Cancel every idle response not finished; the number of cancels refused."""
        errors = 0
        for st in idle:
            if st.response_id and st.terminal is None:
                status, body = http_json(self.srv.port, "POST", f"/v1/responses/{st.response_id}/cancel",
                                         {}, headers=self.auth)
                if status != 200 and not (status == 409 and body and
                                          body.get("error", {}).get("code") == "task_finished"):
                    errors += 1
                    st.error = st.error or f"cancel answered {status}: {body}"
        return errors


def drive(load: Load) -> dict:
    """The run's phases: active streams, idle ones beside them, the active end, the cancels."""
    args = load.args
    active = load.open_active()
    idle = load.open_idle()
    active_left = sum(1 for st in active if st.terminal is None and st.error is None)
    print(f"{len(idle)} idle streams open after {time.monotonic() - load.t0:.1f}s, with {active_left} "
          f"active streams still running; {OPEN.now} streams open", flush=True)
    for st in active:
        st.thread.join(args.timeout)
    t_active = time.monotonic() - load.t0
    running_idle = sum(1 for st in idle if st.terminal is None and st.error is None)
    print(f"active streams done after {t_active:.1f}s; {running_idle} idle streams still open", flush=True)
    time.sleep(args.hold)
    cancel_errors = load.cancel(idle)
    for st in list(load.streams):
        if st.thread is not None:
            st.thread.join(args.timeout)
    return {"active_phase_s": round(t_active, 1), "active_running_when_idle_open": active_left,
            "idle_open_when_active_done": running_idle, "cancel_errors": cancel_errors}


def by_kind(streams: list[Stream]) -> dict:
    """Per kind (active, idle): streams, good ones, events, heartbeats, terminal events."""
    kinds: dict = {}
    for st in streams:
        k = kinds.setdefault(st.kind, {"streams": 0, "good": 0, "events": 0, "heartbeats": 0, "terminal": {}})
        k["streams"] += 1
        k["good"] += st.good()
        k["events"] += st.events
        k["heartbeats"] += st.heartbeats
        k["terminal"][st.terminal] = k["terminal"].get(st.terminal, 0) + 1
    return kinds


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, exit_on_term)
    raise_fd_limit()
    started = time.time()
    work = args.work_dir.resolve()
    model = make_models([args.model], [], work)[0]
    s = ServeSettings(threads=args.threads or (os.cpu_count() or 1), parallel=args.parallel,
                      ctx_per_seq=512, n_gpu_layers=0)
    srv = LmspServer.create(lmsp_command(args.lmsp), model, s, work, "lmsp",
                            {"LMSP_HEARTBEAT_SECONDS": str(args.heartbeat),
                             "LMSP_MAX_UNFINISHED_PER_CLIENT": "0"})  # one client queues them all
    threading.stack_size(256 * 1024)
    try:
        srv.start()
        srv.ready(s)
        load = Load(srv, {"Authorization": f"Bearer {srv.pair()}"}, model, args)
        watch = RssWatch(srv.proc.pid)
        watch.start()
        phases = drive(load)
        peak = watch.stop()
        alive = srv.alive()
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        srv.stop()
    bad = [st for st in load.streams if not st.good()]
    report = {"idle": args.idle, "active": args.active, "parallel": args.parallel,
              "elapsed_s": round(time.monotonic() - load.t0, 1), **phases,
              "most_streams_open_at_once": OPEN.peak, "peak_rss_mb": round(peak / 1048576, 1),
              "server_alive_at_end": alive, "by_kind": by_kind(load.streams),
              "errors": sorted({st.error for st in bad if st.error})[:10]}
    print(json.dumps(report, indent=2))
    write_result("idle_streams", model.stem, {"command": shlex.join([sys.executable, *sys.argv]), **report},
                 started=started, out=args.out)
    return 0 if not bad and alive else 1


if __name__ == "__main__":
    sys.exit(main())
