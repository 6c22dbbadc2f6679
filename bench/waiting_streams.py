#!/usr/bin/env python3
"""What streams that wait cost the server: CPU time while they have nothing to send.

    python bench/waiting_streams.py                   # 0 and 500 waiting streams, 3 rounds
    python bench/waiting_streams.py --streams 0,100,500 --rounds 1

Against one ``lmsp serve`` (one worker, one engine slot) on the ``bench``
demo model: one background response of many tokens keeps the slot busy; then
N background responses are created, which queue behind it, and each is
followed with ``GET /v1/responses/{id}?stream=true``. Those streams wait for
their first event. Over ``--seconds``, the script adds up the CPU time of the
server's processes (user and system, every thread) and prints it as a share of
one core, for each N, in the same run: the difference from N = 0 is what the
waiting streams cost. The slot stays busy through the window, so the engine's
share is the same in every row.
"""
from __future__ import annotations

import argparse
import http.client
import shlex
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_path import write_result  # noqa: E402
from serving.procs import raise_fd_limit, tree_cpu_seconds  # noqa: E402
from serving.servers import ROOT, LmspServer, ServeSettings, lmsp_command, make_models  # noqa: E402
from serving.sse import http_json  # noqa: E402


def post(port: int, headers: dict, body: dict) -> dict:
    status, out = http_json(port, "POST", "/v1/responses", body, headers, timeout=60)
    if status not in (200, 202) or not out:
        raise RuntimeError(f"POST /v1/responses answered {status}: {out}")
    return out


def follow(port: int, headers: dict, response_id: str, opened: threading.Semaphore, good: list) -> None:
    """Hold a stream open, reading whatever comes, until the server closes it; ``good``
    gets one entry for a stream the server accepted (200)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request("GET", f"/v1/responses/{response_id}?stream=true",
                     headers={**headers, "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status == 200:
            good.append(response_id)
        opened.release()
        while resp.read1(4096):
            pass
    except (OSError, http.client.HTTPException):
        opened.release()
    finally:
        conn.close()


def one(args, model: Path, work: Path, n: int) -> dict:
    s = ServeSettings(threads=args.threads, parallel=1, ctx_per_seq=4096, n_gpu_layers=0)
    srv = LmspServer.create(lmsp_command(args.lmsp), model, s, work, "lmsp",
                                  {"LMSP_MAX_OUTPUT_TOKENS_CAP": "4000",
                                   "LMSP_MAX_UNFINISHED_PER_CLIENT": "0"})  # one client queues them all
    try:
        srv.start()
        srv.ready(s)
        headers = {"Authorization": f"Bearer {srv.pair()}"}
        busy = post(srv.port, headers, {"model": model.stem, "input": "Count on:", "temperature": 0,
                                        "max_output_tokens": 4000, "background": True})
        opened = threading.Semaphore(0)
        good: list[str] = []
        for i in range(n):
            rid = post(srv.port, headers, {"model": model.stem, "input": f"Question {i}",
                                           "max_output_tokens": 4, "background": True})["id"]
            threading.Thread(target=follow, args=(srv.port, headers, rid, opened, good), daemon=True).start()
        for _ in range(n):
            if not opened.acquire(timeout=60):
                raise RuntimeError("a stream did not open within 60 s")
        if len(good) != n:
            raise RuntimeError(f"{n - len(good)} of {n} streams were refused")
        time.sleep(1.0)  # every stream has read what there was and waits
        cpu0, t0 = tree_cpu_seconds(srv.proc.pid), time.monotonic()
        time.sleep(args.seconds)
        cpu = tree_cpu_seconds(srv.proc.pid) - cpu0
        wall = time.monotonic() - t0
        status, task = http_json(srv.port, "GET", f"/v1/responses/{busy['id']}", headers=headers)
        if status != 200 or task.get("status") != "in_progress":
            raise RuntimeError(f"the busy response did not last the window ({status}: {task.get('status')})")
        return {"streams": n, "cpu_share": round(cpu / wall, 3), "seconds": round(wall, 2)}
    finally:
        srv.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", default="0,500", help="numbers of waiting streams, comma separated")
    p.add_argument("--rounds", type=int, default=3, help="runs of every number, taking turns")
    p.add_argument("--seconds", type=float, default=5.0, help="length of the measured window")
    p.add_argument("--threads", type=int, default=1, help="engine threads")
    p.add_argument("--model", default="bench",
                   help="a demo shape of bench/bench_models.py (slow enough to keep the slot busy)")
    p.add_argument("--lmsp", default=None, help="command that runs the lmsp CLI")
    p.add_argument("--work-dir", type=Path, default=ROOT / "bench" / "out" / "waiting")
    p.add_argument("--json", type=Path, nargs="?", const=True, default=None,
                   help="write the rows here (no path: bench/results/TIME-waiting_streams-MODEL.json)")
    args = p.parse_args(argv)
    raise_fd_limit()
    started = time.time()
    work = args.work_dir.resolve()
    model = make_models([args.model], [], work)[0]
    counts = [int(x) for x in args.streams.split(",") if x]
    rows = []
    for rnd in range(args.rounds):
        for n in counts:
            row = dict(one(args, model, work, n), round=rnd)
            rows.append(row)
            print(f"round {rnd}: {n:4d} waiting streams: server CPU {row['cpu_share']:.1%} of a core", flush=True)
    print("\n| waiting streams | server CPU, share of one core (median of rounds) |\n| --- | --- |")
    for n in counts:
        shares = sorted(r["cpu_share"] for r in rows if r["streams"] == n)
        print(f"| {n} | {shares[len(shares) // 2]:.1%} |")
    if args.json:
        write_result("waiting_streams", args.model, {"command": shlex.join([sys.executable, *sys.argv]),
                                                     "rows": rows},
                     started=started, out=None if args.json is True else args.json)
    shutil.rmtree(work / "data", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
