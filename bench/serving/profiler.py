"""Profiles of a server while one level runs (``--profile py-spy|perf``)."""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .procs import _status_kb, process_tree


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


