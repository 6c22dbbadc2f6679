"""Drive a real ``lmsp serve`` process for the reliability runs and tests.

Everything here talks to the service the way a client or an operator does:
the ``lmsp`` command line, HTTP on a local port, signals to its processes and
the files of its data directory. Nothing imports the service's internals, so
a run exercises exactly what ships.

    server = Server(tmp_path / "data", log=tmp_path / "server.log")
    server.start()                          # returns once /readyz says ready
    client = server.pair(["responses:write", "responses:read"])
    status, headers, body = client.post("/v1/responses", {...})
    server.crash()                          # SIGKILL to every process of the service
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent

__all__ = [
    "REPO", "Client", "HTTPResult", "SSEEvent", "Server", "ServerDied",
    "bench_main", "descendants", "free_port", "read_rss_kib",
]


class ServerDied(RuntimeError):
    """The service process exited when it should have been running."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- processes

NGINX_SITE = REPO / "deploy" / "nginx" / "lmsp.conf"


def shipped_location() -> str:
    """The ``location`` blocks of deploy/nginx/lmsp.conf's TLS server, as shipped:
    ``location /`` and the one that keeps ``/metrics`` to the machine itself."""
    import re

    site = NGINX_SITE.read_text()
    blocks = []
    for start, what in ((r"location / \{", "location /"), (r"location [^\n]*metrics[^\n]*\{", "metrics")):
        match = re.search(rf"^    {start}\n.*?^    \}}\n", site, re.S | re.M)
        if match is None:
            raise RuntimeError(f"no '{what}' block in {NGINX_SITE}")
        blocks.append(match.group(0))
    return "".join(blocks)


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_nginx(root: Path, upstream: int, *, connections: int = 256,
                keepalive: int = 16) -> tuple[subprocess.Popen, int]:
    """A real nginx in the foreground, proxying to 127.0.0.1:``upstream`` with the
    shipped site's ``location /`` block; every file it writes lives under ``root``.
    Returns the process and the loopback port it listens on."""
    port = free_port()
    http = f"""
    upstream lmsp {{ server 127.0.0.1:{upstream}; keepalive {keepalive}; }}
    server {{
        listen 127.0.0.1:{port};
{shipped_location()}
    }}
"""
    return run_nginx(root, http, port, connections), port


def shipped_site(port: int, upstream: int, cert: Path, key: Path, **values: str) -> str:
    """The whole of deploy/nginx/lmsp.conf, with only what a test must change: its TLS
    server on 127.0.0.1:``port``, its plain-HTTP one on a free loopback port (the IPv6
    listen lines dropped), the upstream on 127.0.0.1:``upstream``, the certificate and
    key at ``cert`` and ``key``. ``values`` gives a directive a new value wherever the
    site sets it (``client_header_timeout="2s"``)."""
    import re

    site = NGINX_SITE.read_text()
    changes = [("    listen 443 ssl http2;\n", f"    listen 127.0.0.1:{port} ssl http2;\n"),
               ("    listen [::]:443 ssl http2;\n", ""),
               ("    listen 80;\n", f"    listen 127.0.0.1:{free_port()};\n"),
               ("    listen [::]:80;\n", ""),
               ("server 127.0.0.1:8080;", f"server 127.0.0.1:{upstream};"),
               ("/etc/ssl/certs/lmsp.pem", str(cert)),
               ("/etc/ssl/private/lmsp.key", str(key))]
    for old, new in changes:
        if old not in site:
            raise RuntimeError(f"{old.strip()!r} is no longer in {NGINX_SITE}")
        site = site.replace(old, new)
    for name, value in values.items():
        site, count = re.subn(rf"^(\s*{name}) [^;]+;", rf"\g<1> {value};", site, flags=re.M)
        if count == 0:
            raise RuntimeError(f"{NGINX_SITE} sets no {name}")
    return site


def run_nginx(root: Path, http: str, port: int, connections: int) -> subprocess.Popen:
    """nginx in the foreground with one worker of ``connections`` connections and ``http``
    as its http block's body, once it listens on ``port``; every file it writes lives
    under ``root``."""
    import shutil

    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        raise RuntimeError("nginx is not installed (scripts/dev test installs it where it can)")
    for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (root / name).mkdir(parents=True, exist_ok=True)
    conf = root / "nginx.conf"
    conf.write_text(f"""
daemon off;
master_process on;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log info;
events {{ worker_connections {connections}; }}
http {{
    access_log {root}/access.log;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
{http}
}}
""")
    proc = subprocess.Popen([binary, "-p", str(root), "-c", str(conf), "-e", str(root / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            log = (root / "error.log").read_text(errors="replace") if (root / "error.log").exists() else ""
            raise RuntimeError(f"nginx exited ({proc.returncode}):\n{log}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("nginx did not listen within 30 s") from None
            time.sleep(0.05)


def _proc_stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, pgrp, state) of a process, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = raw[raw.rindex(")") + 2:].split()
    return int(rest[1]), int(rest[2]), rest[0]


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def descendants(pid: int) -> dict[int, int]:
    """All living descendants of ``pid`` as {pid: parent pid} (zombies left out)."""
    parents: dict[int, int] = {}
    for p in _all_pids():
        st = _proc_stat(p)
        if st is not None and st[2] != "Z":
            parents[p] = st[0]
    out: dict[int, int] = {}
    frontier = [pid]
    while frontier:
        cur = frontier.pop()
        for child, parent in parents.items():
            if parent == cur and child not in out:
                out[child] = parent
                frontier.append(child)
    return out


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for p in _all_pids():
        st = _proc_stat(p)
        if st is not None and st[1] == pgid and st[2] != "Z":
            alive.append(p)
    return alive


def read_rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


# --------------------------------------------------------------------- HTTP

@dataclass
class HTTPResult:
    status: int
    headers: dict[str, str]
    body: object          # parsed JSON, or the raw text when it is not JSON
    raw: bytes = b""

    def __iter__(self):   # status, headers, body = client.get(...)
        return iter((self.status, self.headers, self.body))

    @property
    def error_code(self) -> str | None:
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            return self.body["error"].get("code")
        return None


@dataclass
class SSEEvent:
    id: str | None
    event: str | None
    data: object


@dataclass
class Client:
    """A minimal HTTP client on the standard library: one connection a request."""

    host: str
    port: int
    token: str | None = None
    timeout: float = 30.0
    client_id: str | None = None
    scopes: list[str] = field(default_factory=list)

    def _headers(self, extra: dict[str, str] | None, body: bytes | None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        headers.update(extra or {})
        return headers

    def request(self, method: str, path: str, body: object = None, *,
                headers: dict[str, str] | None = None, raw_body: bytes | None = None,
                timeout: float | None = None) -> HTTPResult:
        data = raw_body if raw_body is not None else (
            None if body is None else json.dumps(body).encode())
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)
        try:
            conn.request(method, path, body=data, headers=self._headers(headers, data))
            resp = conn.getresponse()
            raw = resp.read()
            hdrs = {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()
        parsed: object = raw.decode("utf-8", "replace")
        if "json" in hdrs.get("content-type", ""):
            with contextlib.suppress(ValueError):
                parsed = json.loads(raw)
        return HTTPResult(resp.status, hdrs, parsed, raw)

    def get(self, path: str, **kw) -> HTTPResult:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: object = None, **kw) -> HTTPResult:
        return self.request("POST", path, body, **kw)

    def delete(self, path: str, **kw) -> HTTPResult:
        return self.request("DELETE", path, **kw)

    @contextlib.contextmanager
    def stream(self, method: str, path: str, body: object = None, *,
               headers: dict[str, str] | None = None,
               timeout: float | None = None) -> Iterator[tuple[int, dict[str, str], Iterator[SSEEvent]]]:
        """Open a request whose answer is an event stream; leaving the block
        closes the connection (a client that goes away)."""
        data = None if body is None else json.dumps(body).encode()
        extra = {"Accept": "text/event-stream", **(headers or {})}
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)
        try:
            conn.request(method, path, body=data, headers=self._headers(extra, data))
            resp = conn.getresponse()
            hdrs = {k.lower(): v for k, v in resp.getheaders()}
            yield resp.status, hdrs, _sse_events(resp)
        finally:
            with contextlib.suppress(OSError):
                if conn.sock is not None:
                    conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()


def _sse_events(resp: http.client.HTTPResponse) -> Iterator[SSEEvent]:
    ident = event = None
    data: list[str] = []
    while True:
        line = resp.readline()
        if not line:
            return
        text = line.decode("utf-8").rstrip("\r\n")
        if text == "":
            if data or event:
                joined = "\n".join(data)
                try:
                    payload: object = json.loads(joined)
                except ValueError:
                    payload = joined
                yield SSEEvent(ident, event, payload)
            ident = event = None
            data = []
        elif text.startswith(":"):
            continue
        else:
            name, _, value = text.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "id":
                ident = value
            elif name == "event":
                event = value
            elif name == "data":
                data.append(value)


# ------------------------------------------------------------------ service

class Server:
    """One ``lmsp serve`` service on a data directory, in its own process group."""

    def __init__(self, data_dir: Path, *, log: Path, port: int | None = None,
                 model: Path | None = None, env: dict[str, str] | None = None,
                 extra_args: list[str] | None = None, ready_timeout: float = 90.0,
                 prefix: list[str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.log = Path(log)
        self.port = port or free_port()
        self.model = model
        # one decoding thread unless told otherwise: on a small shared machine
        # llama.cpp's spinning thread pool only fights the clients for the cores
        self.env = {"LMSP_N_THREADS": "1", **(env or {})}
        self.extra_args = list(extra_args or [])
        self.prefix = list(prefix or [])   # e.g. a tracer the service runs under
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    # -- life cycle
    @property
    def lmsp(self) -> str:
        return str(VENV_BIN / "lmsp")

    def command(self) -> list[str]:
        cmd = [*self.prefix, self.lmsp, "serve", "--data-dir", str(self.data_dir),
               "--bind", f"127.0.0.1:{self.port}"]
        if self.model is not None:
            cmd += ["--model", str(self.model)]
        return cmd + self.extra_args

    def start(self, *, wait: bool = True) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("the service is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env}
        env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
        env.pop("LMSP_DATA_DIR", None)
        with self.log.open("ab") as log:
            log.write(f"\n==== start {self.starts + 1}: {' '.join(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.starts += 1
        if wait:
            self.wait_ready()

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no log)"

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise ServerDied(f"the service exited (code {code}); log tail:\n{self.log_tail()}")

    def wait_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        probe = self.anonymous(timeout=5)
        while True:
            self.check_alive()
            with contextlib.suppress(OSError, http.client.HTTPException):
                if probe.get("/readyz").status == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the service was not ready in time; log tail:\n{self.log_tail()}")
            time.sleep(0.05)

    def crash(self) -> None:
        """SIGKILL every process of the service at once (master and workers)."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + 30
        while _group_alive(pgid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes of the service survived SIGKILL: {_group_alive(pgid)}")
            time.sleep(0.02)
        self.proc = None

    def stop(self, timeout: float = 30.0) -> int | None:
        """Graceful stop (SIGTERM), then SIGKILL whatever is left."""
        if self.proc is None:
            return None
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait()
        self.proc = None
        return code

    # -- processes of a running service
    def master_pid(self) -> int:
        """The gunicorn arbiter: the parent of the leaves of the process tree
        (``lmsp serve`` may be the arbiter itself or start it as a child)."""
        self.check_alive()
        tree = descendants(self.proc.pid)
        leaf_parents = {tree[p] for p in tree if p not in set(tree.values())}
        if len(leaf_parents) > 1:
            raise RuntimeError(f"cannot tell the arbiter in the process tree {tree}")
        return leaf_parents.pop() if leaf_parents else self.proc.pid

    def worker_pids(self) -> list[int]:
        master = self.master_pid()
        return sorted(p for p, parent in descendants(master).items() if parent == master)

    # -- clients
    def anonymous(self, timeout: float = 30.0) -> Client:
        return Client("127.0.0.1", self.port, None, timeout)

    def admin(self) -> Client:
        token = (self.data_dir / "admin.token").read_text().strip()
        return Client("127.0.0.1", self.port, token)

    def cli(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        env = {**os.environ, **self.env}
        env.pop("LMSP_DATA_DIR", None)
        return subprocess.run([self.lmsp, *args], capture_output=True, text=True,
                              timeout=timeout, env=env, stdin=subprocess.DEVNULL)

    def pairing_code(self, scopes: list[str]) -> str:
        done = self.cli("pair", "--data-dir", str(self.data_dir), "--scopes", ",".join(scopes), "--json")
        if done.returncode != 0:
            raise RuntimeError(f"lmsp pair failed ({done.returncode}): {done.stderr}")
        return json.loads(done.stdout)["code"]

    def pair(self, scopes: list[str], name: str = "reliability", *, over_http: bool = False) -> Client:
        """A new paired client; the code comes from ``lmsp pair`` on the box, or
        (``over_http``) from ``POST /v1/pairings`` with the admin token, so that
        no process outside the service writes to its database."""
        if over_http:
            made = self.admin().post("/v1/pairings", {"scopes": scopes, "name": name})
            if made.status != 201:
                raise RuntimeError(f"POST /v1/pairings failed: {made.status} {made.body}")
            code = made.body["code"]
        else:
            code = self.pairing_code(scopes)
        result = self.anonymous().post("/v1/pair", {"code": code, "client_name": name})
        if result.status != 201:
            raise RuntimeError(f"pairing failed: {result.status} {result.body}")
        body = result.body
        return Client("127.0.0.1", self.port, body["token"], client_id=body.get("client_id"),
                      scopes=list(body.get("scopes") or scopes))


# --------------------------------------------------------------- long runs

def bench_main(doc: str, argv: list[str] | None, options, run, failed=lambda summary: False) -> int:
    """The command line of a long run: its own ``options(parser)`` plus
    ``--workdir`` and ``--json``; ``run(args, workdir, log)`` returns the
    summary, which is printed (and written); ``failed(summary)`` sets the exit status."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    options(ap)
    ap.add_argument("--workdir", type=Path, help="keep the data directory and logs here (default: a temporary one)")
    ap.add_argument("--json", type=Path, nargs="?", const=True,
                    help="write the figures to this file too (no path: bench/results/TIME-SCRIPT-MODEL.json)")
    args = ap.parse_args(argv)
    started = time.time()
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lmsp-rel-")))
        workdir.mkdir(parents=True, exist_ok=True)
        summary = run(args, workdir, lambda message: print(message, flush=True))
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        out = args.json if args.json is not True else default_result(args, started)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**run_record(argv), **summary}, indent=2) + "\n")
    return 1 if failed(summary) else 0


def default_result(args: argparse.Namespace, started: float) -> Path:
    """bench/results/<start>-<script>-<model>.json: the script's name, the model given with
    ``--model`` or the demo model (tiny) the harness serves otherwise."""
    sys.path.insert(0, str(REPO / "bench"))
    from results_path import result_path

    model = Path(args.model).stem if getattr(args, "model", None) else "tiny"
    return result_path(Path(sys.argv[0]).stem, model, started)


def run_record(argv: list[str] | None) -> dict:
    """What a result file says of its run: the commit (and the tracked files changed since),
    the time it ended (UTC), the machine and the command as typed in the repository's root."""
    import platform
    import shlex

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    def here(path: str) -> str:
        full = Path(path).absolute()
        return str(full.relative_to(REPO)) if full.is_relative_to(REPO) else path

    cpu = platform.processor()
    with contextlib.suppress(OSError):
        models = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")]
        cpu = models[0] if models else cpu
    words = [here(sys.executable), here(sys.argv[0]), *(sys.argv[1:] if argv is None else argv)]
    return {"commit": git("rev-parse", "HEAD"), "changed_since_commit": git("diff", "--name-only", "HEAD").split(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"nproc": len(os.sched_getaffinity(0)), "cpu_model": cpu}, "command": shlex.join(words)}
