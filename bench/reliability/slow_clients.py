"""Slow clients against gunicorn directly and through nginx with the shipped site.

Four clients, each on its own connection, while a normal client keeps
calling ``/healthz`` (it must always be served):

- ``head``: the request line, then one header line every ``--interval`` s;
- ``body``: a complete head announcing 100 bytes, then one byte every
  ``--interval`` s;

each sent straight to gunicorn and through nginx (the ``location /`` block
of ``deploy/nginx/lmsp.conf`` as shipped, nginx's default client timeouts).
Reported: whether and after how many seconds each was cut off (closed or
answered), within ``--duration`` seconds.

    python bench/reliability/slow_clients.py --duration 90 --interval 5
"""
from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rel_harness import Server, bench_main, start_nginx, stop_process  # noqa: E402


def _slow(port: int, kind: str, token: str, interval: float, duration: float, out: dict, key: str) -> None:
    t0 = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        if kind == "head":
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        else:
            sock.sendall(f"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                         "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode())
        i = 0
        while time.monotonic() - t0 < duration:
            try:
                sock.sendall(b"X-Slow-%d: y\r\n" % i if kind == "head" else b" ")
                i += 1
                sock.settimeout(interval)
                data = sock.recv(4096)
                status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else None
                out[key] = {"cut_after_s": round(time.monotonic() - t0, 1),
                            "how": f"answered {status}" if data else "closed"}
                return
            except socket.timeout:
                continue
            except OSError as exc:
                out[key] = {"cut_after_s": round(time.monotonic() - t0, 1), "how": type(exc).__name__}
                return
        out[key] = {"cut_after_s": None, "how": f"still open after {duration:.0f} s"}
    finally:
        sock.close()


def run(workdir: Path, duration: float, interval: float) -> dict:
    server = Server(workdir / "data", log=workdir / "server.log")
    server.start()
    nginx = None
    try:
        nginx, nport = start_nginx(workdir / "nginx", server.port)
        token = server.admin().token
        out: dict = {}
        threads = [threading.Thread(target=_slow, args=(port, kind, token, interval, duration, out, f"{via}/{kind}"))
                   for via, port in (("gunicorn", server.port), ("nginx", nport)) for kind in ("head", "body")]
        for t in threads:
            t.start()
        served = failed = 0
        while any(t.is_alive() for t in threads):
            try:
                ok = server.anonymous(timeout=10).get("/healthz").status == 200
            except OSError:
                ok = False
            served, failed = served + ok, failed + (not ok)
            time.sleep(0.5)
        for t in threads:
            t.join()
        server.check_alive()
        return {"duration_s": duration, "interval_s": interval, "slow_clients": out,
                "healthz_served_meanwhile": served, "healthz_failed_meanwhile": failed}
    finally:
        if nginx is not None:
            stop_process(nginx)
        server.stop()


def main(argv: list[str] | None = None) -> int:
    def options(ap) -> None:
        ap.add_argument("--duration", type=float, default=90)
        ap.add_argument("--interval", type=float, default=5)

    return bench_main(__doc__, argv, options, lambda a, workdir, log: run(workdir, a.duration, a.interval))


if __name__ == "__main__":
    sys.exit(main())
