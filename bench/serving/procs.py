"""The processes of a serving run: their tree, peak memory and CPU time, ports and limits.

Everything is read from /proc, so that both servers are measured the same way
whatever they are made of (one llama-server process; a gunicorn master and its
worker for lmsp).
"""
from __future__ import annotations

import os
import platform
import resource
import socket
import threading


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


def exit_on_term(signum, frame) -> None:
    raise SystemExit(128 + signum)   # unwinds through the finally blocks that stop the servers


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


