"""``lmsp rpc-server`` processes on loopback for the tests of models split over
them (tests/native/test_rpc.py, tests/e2e/test_rpc_served.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from loopback import free_port, lmsp_command  # noqa: F401 (the helpers' users import them from here)

from lmsp import native


class RpcServer:
    """``lmsp rpc-server --bind 127.0.0.1:PORT --threads N``, its output in a file."""

    def __init__(self, log_dir: Path, port: int | None = None, threads: int = 1) -> None:
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = log_dir / f"rpc-server-{self.port}.log"
        self.threads = threads
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> "RpcServer":
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*lmsp_command(), "rpc-server", "--bind", self.address, "--threads", str(self.threads)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=os.environ.copy(),
            )
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"rpc-server exited:\n{self.log()}"
            try:
                native.rpc_hello(self.address, 1000)
                return self
            except native.RpcUnreachableError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"rpc-server did not answer:\n{self.log()}") from None
                time.sleep(0.1)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM; its exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.proc = None
        return code

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class FakeServer:
    """A listener on loopback that answers each connection with :meth:`answer`, on a
    thread, until closed."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    self.answer(conn)
                except OSError:  # a greeting of the engine's own closes at once
                    pass

    def answer(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.sock.close()


def greeting(version: tuple[int, ...] | list[int]) -> bytes:
    """An RPC server's answer to HELLO in protocol ``version``."""
    answer = bytes([*version, 0]) + bytes(24)
    return len(answer).to_bytes(8, "little") + answer


class OtherVersionServer(FakeServer):
    """Greets as an RPC server of protocol ``major.minor.patch`` (another llama.cpp
    version), then closes."""

    def __init__(self, version: tuple[int, int, int]) -> None:
        self.version = version
        super().__init__()

    def answer(self, conn: socket.socket) -> None:
        conn.recv(1 + 8 + 24)
        conn.sendall(greeting(self.version))
