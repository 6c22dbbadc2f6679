"""Power-cut simulation for the default durability (``full``): acknowledged
tasks survive losing everything that was not fsynced.

How it is shown, exactly:

1. The real service runs under ``strace -f`` on a fresh data directory. The
   trace records, in completion order over all processes and threads, every
   ``openat``/``close``/``dup*`` (to know which descriptor is which file),
   every ``pwrite64``/``write`` with its full data, ``ftruncate``,
   ``fsync``/``fdatasync``, ``unlink*``/``rename*`` and every ``sendto``/
   ``write``/``writev`` on a socket (to see each ``202 Accepted`` leave).
   ``clone``/``fork`` tell threads (sharing descriptors) from processes.
2. Clients send background requests (and a few plain ones) while it runs.
3. The trace is replayed: for each file of the data directory two images are
   kept, the *current* bytes (every write applied) and the *durable* bytes
   (the current bytes as of that file's last fsync). A power cut at any
   point of the trace leaves at least the durable images.
4. At the moment each ``202`` was written to its socket (and at random
   other points) the durable images of ``lmsp.db`` and ``lmsp.db-wal`` are
   written to a scratch directory and opened with SQLite: ``PRAGMA
   integrity_check`` must be ``ok``, every response acknowledged so far
   must be there, and the invariants of ``rel_checker.check_log`` hold.
5. The same points are checked once more with a random subset of the
   writes issued since the last fsync applied on top (some reach the disk,
   some do not; a write may also be torn at a 512-byte boundary), which is
   what a real power cut may leave as well.

Assumptions, stated: directory entries (file creation, unlink, rename) are
taken as durable when they happen (SQLite syncs the directory of a new WAL
in ``full`` mode; the image model does not track directories), and the
``-shm`` index is never kept (SQLite rebuilds it from the WAL).

    python bench/reliability/powercut.py --requests 150 [--json [OUT]]
"""
from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rel_checker import StoreView, Violation, check_log, integrity  # noqa: E402
from rel_harness import Server, bench_main, descendants  # noqa: E402

SYSCALLS = ("openat,open,creat,close,dup,dup2,dup3,fcntl,pwrite64,pwritev,pwritev2,write,writev,ftruncate,"
            "fsync,fdatasync,unlink,unlinkat,rename,renameat,renameat2,sendto,sendmsg,clone,clone3,fork,vfork")

_LINE = re.compile(r"^(\d+)\s+(.*)$")
_CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+|\?)(?:\s.*)?$", re.S)
_UNFINISHED = re.compile(r"^(\w+)\((.*) <unfinished \.\.\.>$", re.S)
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$", re.S)
_STR = re.compile(r'"((?:\\x[0-9a-f]{2})*)"(\.\.\.)?')


def _bytes(arg: str) -> bytes:
    m = _STR.match(arg.strip())
    if m is None:
        raise ValueError(f"not a string argument: {arg[:60]}")
    if m.group(2):
        raise ValueError("a string argument was truncated by strace (raise -s)")
    return bytes.fromhex(m.group(1).replace("\\x", ""))


def _split_args(text: str) -> list[str]:
    """Split strace arguments at top-level commas (strings are all \\x escapes)."""
    out, depth, cur, in_str = [], 0, [], False
    for ch in text:
        if ch == '"':
            in_str = not in_str
        elif not in_str:
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            elif ch == "," and depth == 0:
                out.append("".join(cur).strip())
                cur = []
                continue
        cur.append(ch)
    if cur:
        out.append("".join(cur).strip())
    return out


@dataclass
class Call:
    pid: int
    name: str
    args: list[str]
    ret: int | None


def parse_trace(path: Path):
    """Complete calls in completion order (unfinished halves joined)."""
    pending: dict[int, tuple[str, str]] = {}
    with path.open("r", errors="replace") as fh:
        for raw in fh:
            m = _LINE.match(raw.rstrip("\n"))
            if not m:
                continue
            pid, rest = int(m.group(1)), m.group(2)
            u = _UNFINISHED.match(rest)
            if u:
                pending[pid] = (u.group(1), u.group(2))
                continue
            r = _RESUMED.match(rest)
            if r:
                name, args0 = pending.pop(pid, (r.group(1), ""))
                rest = f"{name}({args0}{r.group(2)}"
            c = _CALL.match(rest)
            if not c:
                continue
            ret = None if c.group(3) == "?" else int(c.group(3))
            yield Call(pid, c.group(1), _split_args(c.group(2)), ret)


# ------------------------------------------------------------------ replay

@dataclass
class Image:
    current: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    since_sync: list[tuple[int, bytes]] = field(default_factory=list)   # writes after the last fsync


def _apply(buf: bytearray, offset: int, data: bytes) -> None:
    if len(buf) < offset:
        buf.extend(b"\0" * (offset - len(buf)))
    buf[offset:offset + len(data)] = data


class Replay:
    """Descriptor tables per process and file images per path."""

    def __init__(self, data_dir: Path) -> None:
        self.root = str(data_dir)
        self.tgid: dict[int, int] = {}
        self.fds: dict[int, dict[int, str]] = {}
        self.images: dict[str, Image] = {}
        self.acks: list[tuple[int, str]] = []     # (call index, response id)
        self.counts = Counter()

    def table(self, pid: int) -> dict[int, str]:
        return self.fds.setdefault(self.tgid.setdefault(pid, pid), {})

    def step(self, i: int, call: Call) -> None:
        """Replay call ``i`` (in completion order) on the images and the file tables."""
        name = call.name
        if call.ret is None or call.ret < 0:
            return
        fds = self.table(call.pid)
        if name in ("clone", "clone3", "fork", "vfork"):
            self._clone(call, fds)
        elif name in ("openat", "open", "creat"):
            self._open(call, fds)
        elif (name in ("close", "dup", "dup2", "dup3", "unlink", "unlinkat") or name.startswith("rename")
              or (name == "fcntl" and "F_DUPFD" in call.args[1])):
            self._names(call, fds)
        elif name in ("sendto", "sendmsg", "write", "writev") and int(call.args[0]) not in fds:
            self._socket(i, call)
        else:
            self._file(call, fds)

    def _clone(self, call: Call, fds: dict[int, str]) -> None:
        """A new thread shares its process's file table; a new process gets a copy, unless
        CLONE_FILES."""
        child = call.ret
        if child == 0:
            return
        flags = " ".join(call.args)
        if "CLONE_THREAD" in flags:
            self.tgid[child] = self.tgid.setdefault(call.pid, call.pid)
        else:
            self.tgid[child] = child
            self.fds[child] = dict(fds) if "CLONE_FILES" not in flags else fds

    def _open(self, call: Call, fds: dict[int, str]) -> None:
        name, a, ret = call.name, call.args, call.ret
        path = _bytes(a[1] if name == "openat" else a[0]).decode(errors="replace")
        if not os.path.isabs(path):
            return
        fds[ret] = path
        if path.startswith(self.root) and os.path.basename(path).startswith("lmsp.db") \
                and path not in self.images:
            self.images[path] = Image()
        if "O_TRUNC" in (a[2] if name == "openat" else a[1] if len(a) > 1 else "") and path in self.images:
            self.images[path].current = bytearray()

    def _names(self, call: Call, fds: dict[int, str]) -> None:
        """close, dup, unlink, rename: the file tables and the images' names."""
        name, a = call.name, call.args
        if name == "close":
            fds.pop(int(a[0]), None)
        elif name in ("unlink", "unlinkat"):
            path = _bytes(a[0] if name == "unlink" else a[1]).decode(errors="replace")
            if path in self.images:
                del self.images[path]
                self.counts["unlinks"] += 1
        elif name.startswith("rename"):
            old, new = (a[0], a[1]) if name == "rename" else (a[1], a[3])
            old, new = _bytes(old).decode(errors="replace"), _bytes(new).decode(errors="replace")
            if old in self.images:
                self.images[new] = self.images.pop(old)
        elif int(a[0]) in fds:  # dup, dup2, dup3, fcntl F_DUPFD
            fds[call.ret] = fds[int(a[0])]

    def _socket(self, i: int, call: Call) -> None:
        """Bytes to a socket (or a pipe): look for a 202 leaving."""
        name, a = call.name, call.args
        if name in ("sendto", "write"):
            try:
                data = _bytes(a[1])
            except ValueError:
                return
        else:
            data = b"".join(_bytes(m.group(0)) for m in _STR.finditer(" ".join(a[1:])))
        if data.startswith(b"HTTP/1.1 202"):
            m = re.search(rb"\r\nLocation: /v1/responses/(resp_[0-9A-Z]+)", data, re.I)
            if m:
                self.acks.append((i, m.group(1).decode()))

    def _file(self, call: Call, fds: dict[int, str]) -> None:
        """A write, truncation or sync of a database file's image."""
        name, a, ret = call.name, call.args, call.ret
        path = fds.get(int(a[0])) if a and a[0].lstrip("-").isdigit() else None
        image = self.images.get(path) if path else None
        if image is None:
            return
        if name == "pwrite64":
            data = _bytes(a[1])[:ret]
            _apply(image.current, int(a[3]), data)
            image.since_sync.append((int(a[3]), data))
            self.counts["file_writes"] += 1
        elif name == "write":
            raise RuntimeError(f"write() without an offset to {path}: the replay does not track positions")
        elif name in ("pwritev", "pwritev2", "writev"):
            raise RuntimeError(f"{name} to {path}: not handled by the replay")
        elif name == "ftruncate":
            size = int(a[1])
            del image.current[size:]
            image.since_sync.append((-size - 1, b""))   # a truncation, encoded
        elif name in ("fsync", "fdatasync"):
            image.durable = bytes(image.current)
            image.since_sync = []
            self.counts["fsyncs"] += 1


def _materialize(replay: Replay, out: Path, rng: random.Random | None) -> Path | None:
    """The database files a power cut leaves now: durable bytes, plus (with
    ``rng``) a random subset of the later writes, some torn."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    db = None
    for path, image in replay.images.items():
        base = os.path.basename(path)
        if not base.startswith("lmsp.db") or base.endswith("-shm"):
            continue
        buf = bytearray(image.durable)
        if rng is not None:
            for offset, data in image.since_sync:
                if offset < 0:                     # a truncation
                    if rng.random() < 0.5:
                        del buf[-offset - 1:]
                    continue
                r = rng.random()
                if r < 0.4:
                    continue                       # never reached the disk
                if r < 0.55 and len(data) > 512:   # torn at a sector boundary
                    data = data[:512 * rng.randint(1, len(data) // 512)]
                _apply(buf, offset, data)
        (out / base).write_bytes(bytes(buf))
        if base == "lmsp.db":
            db = out / base
    return db


def _check_image(db: Path | None, acked: list[str], label: str) -> tuple[list[Violation], int]:
    if db is None:
        return ([Violation("powercut_lost", None, f"{label}: no database file survived")] if acked else []), 0
    conn = sqlite3.connect(str(db), isolation_level=None)
    try:
        out = integrity(conn)
        if out:
            return [Violation(v.kind, v.task_id, f"{label}: {v.detail}") for v in out], 0
        try:
            view = StoreView.load(conn)
        except sqlite3.OperationalError as exc:      # the schema itself is not there yet
            if acked:
                return [Violation("powercut_lost", None, f"{label}: {exc}")], 0
            return [], 0
        missing = [r for r in acked if r not in view.responses]
        found = [Violation("powercut_lost", r, f"{label}: an acknowledged response is gone") for r in missing]
        found += [Violation(v.kind, v.task_id, f"{label}: {v.detail}") for v in check_log(view)]
        return found, len(view.tasks)
    finally:
        conn.close()


def run(workdir: Path, requests: int, seed: int, random_points: int, model: Path, *,
        durability: str = "full", log=print) -> dict:
    rng = random.Random(seed)
    trace = workdir / "trace.txt"
    t0 = time.monotonic()
    statuses = traced_run(workdir, trace, requests, seed, model, durability)
    traced = time.monotonic() - t0
    log(f"traced run done in {traced:.0f}s; trace {trace.stat().st_size // (1 << 20)} MiB; replaying")
    calls = list(parse_trace(trace))
    replay = Replay(workdir / "data")
    # the check points: every 202 (just after it was written) and random calls
    points_random = set(rng.sample(range(len(calls)), min(random_points, len(calls))))
    violations: list[Violation] = []
    checked: Counter = Counter()
    max_tasks = 0
    scratch = workdir / "image"
    for i, call in enumerate(calls):
        n_acks = len(replay.acks)
        replay.step(i, call)
        is_ack = len(replay.acks) > n_acks
        if not (is_ack or i in points_random):
            continue
        acked = [rid for _, rid in replay.acks]
        found, n = _check_image(_materialize(replay, scratch, None), acked, f"call {i} durable")
        violations += found
        max_tasks = max(max_tasks, n)
        checked["durable_images"] += 1
        found, _ = _check_image(_materialize(replay, scratch, rng), acked, f"call {i} durable+random")
        violations += found
        checked["durable_plus_random_writes_images"] += 1
    shutil.rmtree(scratch, ignore_errors=True)
    return {
        "durability": durability, "requests": sum(statuses.values()), "http_statuses": dict(statuses),
        "acknowledged_202": len(replay.acks), "trace_calls": len(calls),
        "file_writes": replay.counts["file_writes"], "fsyncs": replay.counts["fsyncs"],
        "cut_points_at_202": len(replay.acks), "cut_points_random": len(points_random),
        "images_checked": dict(checked), "most_tasks_in_an_image": max_tasks,
        "acknowledged_lost": len({v.task_id for v in violations if v.kind == "powercut_lost"}),
        "violations": len(violations), "first_violations": [str(v) for v in violations[:20]],
        "traced_seconds": round(traced, 1),
    }


def traced_run(workdir: Path, trace: Path, requests: int, seed: int, model: Path, durability: str) -> Counter:
    """The service under strace, sent ``requests`` requests by 3 clients; the statuses it answered."""
    strace = shutil.which("strace")
    if strace is None:
        raise SystemExit("strace is needed (apt-get install strace)")
    prefix = [strace, "-f", "--seccomp-bpf", "-qq", "-xx", "-s", str(1 << 24), "-e", "signal=none",
              "-e", f"trace={SYSCALLS}", "-o", str(trace)]
    server = Server(workdir / "data", log=workdir / "server.log", prefix=prefix, model=model, ready_timeout=300,
                    env={"LMSP_DURABILITY": durability})
    server.start()
    statuses: Counter = Counter()
    try:
        client = server.pair(["responses:write", "responses:read"], name="powercut", over_http=True)
        lock = threading.Lock()

        def send(n: int, wseed: int) -> None:
            r = random.Random(wseed)
            for i in range(n):
                body = {"model": model.stem, "input": f"request {wseed}-{i}", "max_output_tokens": r.randint(2, 6),
                        "temperature": 0, "background": r.random() < 0.85,
                        "on_restart": r.choice(["fail", "retry", "resume"])}
                res = client.post("/v1/responses", body, headers={"Idempotency-Key": f"pc-{wseed}-{i}"},
                                  timeout=300)
                with lock:
                    statuses[res.status] += 1
                if r.random() < 0.1 and res.status == 202:
                    client.post(f"/v1/responses/{res.body['id']}/cancel", {}, timeout=300)

        threads = [threading.Thread(target=send, args=(requests // 3, seed * 10 + k)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(1.0)
    finally:
        # stop the service itself (strace's child), so that strace sees every
        # tracee exit and closes its output; then make sure nothing is left
        for pid, parent in descendants(server.proc.pid).items():
            if parent == server.proc.pid:
                os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.proc.wait(60)
        server.stop(timeout=5)
    return statuses


def main(argv: list[str] | None = None) -> int:
    def options(ap) -> None:
        ap.add_argument("--requests", type=int, default=150)
        ap.add_argument("--random-points", type=int, default=100)
        ap.add_argument("--seed", type=int, default=1)
        ap.add_argument("--durability", default="full", choices=["full", "normal", "off"],
                        help="the setting under test; 'normal' shows that the check can fail")

    def go(a, workdir: Path, log) -> dict:
        from lmsp.models.demo import write_demo_model
        model = write_demo_model(workdir / "tiny.gguf")   # outside the data directory: not traced
        return run(workdir, a.requests, a.seed, a.random_points, model, durability=a.durability, log=log)

    return bench_main(__doc__, argv, options, go,
                      lambda s: s["violations"] or not s["acknowledged_202"])


if __name__ == "__main__":
    sys.exit(main())
