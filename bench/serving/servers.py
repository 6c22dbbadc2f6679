"""The servers of a serving run: llama-server and ``lmsp serve`` (and its variants),
each started on loopback in its own session with the same settings, logged to a file."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench_models import has_chat_template, resolve

from .procs import free_port
from .sse import http_json

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LLAMA = ROOT / "build" / "reference" / "bin" / "llama-server"
LMSP_SCOPES = "responses:write,responses:read,models:read"
VARIANTS = ("llama", "lmsp", "lmsp-fast", "lmsp-mmap", "lmsp-nofsync", "lmsp-nokv", "lmsp-notiles", "lmsp-windowN",
            "lmsp-noevents", "lmsp-memevents")
LMSP_VARIANT_ENV = {
    "lmsp": {},
    "lmsp-fast": {"LMSP_BATCH_INVARIANT": "0"},
    "lmsp-mmap": {"LMSP_MMAP": "1"},
    "lmsp-nofsync": {"LMSP_DURABILITY": "off"},
    "lmsp-nokv": {"LMSP_KV_CACHE_BYTES": "0"},  # no KV files of finished turns
    "lmsp-notiles": {"LMSP_TILE_MATMUL": "0"},  # csrc/tile_matmul.cpp off: vec_dot for every product
}
# The commit variants of bench/variants.py: gunicorn with the service's configuration and
# the variant's app, named by gunicorn's APP argument (which takes the place of the
# configuration's wsgi_app), with bench/ on the import path.
COMMIT_VARIANTS = {"lmsp-noevents": "variants:get_app('noevents')",
                   "lmsp-memevents": "variants:get_app('memevents')"}


class Server:
    """A server process started in its own session, logged to a file."""

    name = "server"

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> None:
        self.argv, self.env, self.log_path, self.cwd = argv, env, log, cwd
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(("\n$ " + shlex.join(self.argv) + "\n").encode())
        log.flush()
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def wait_ready(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status, _ = http_json(self.port, "GET", path, timeout=2.0)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # a worker left behind by a master that died first
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass




@dataclass(frozen=True)
class ServeSettings:
    threads: int
    parallel: int
    ctx_per_seq: int
    n_gpu_layers: int
    ready_timeout: float = 300.0


def lmsp_command(explicit: str | None) -> list[str]:
    if explicit:
        return shlex.split(explicit)
    venv = ROOT / ".venv" / "bin" / "lmsp"
    if venv.exists():
        return [str(venv)]
    found = shutil.which("lmsp")
    if found:
        return [found]
    return [sys.executable, "-m", "lmsp.cli"]


class LlamaServer(Server):
    name = "llama-server"

    @classmethod
    def create(cls, binary: Path, model: Path, s: ServeSettings, work: Path, extra: list[str]):
        port = free_port()
        argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                "-t", str(s.threads), "-tb", str(s.threads), "--parallel", str(s.parallel),
                "-c", str(s.ctx_per_seq * s.parallel), "--no-kv-unified", "-ngl", str(s.n_gpu_layers),
                # lmsp's batch (n_batch = n_ubatch = 512); flash attention as lmsp has it:
                # on for the CPU, off with layers on a GPU (csrc/batch_plan.cpp)
                "-b", "512", "-ub", "512", "-fa", "off" if s.n_gpu_layers else "on",
                "--no-webui", "--cache-ram", "0", "--log-disable", *extra]
        srv = cls(argv, dict(os.environ), work / "logs" / f"llama-{model.stem}.log", work)
        srv.port = port
        return srv

    def ready(self, s: ServeSettings) -> None:
        self.wait_ready("/health", s.ready_timeout)


def is_variant(name: str) -> bool:
    return name == "llama" or name in LMSP_VARIANT_ENV or name in COMMIT_VARIANTS or window_variant(name) is not None


def window_variant(name: str) -> str | None:
    """N of ``lmsp-windowN`` (a commit window of N ms), else None."""
    n = name.removeprefix("lmsp-window")
    return n if name.startswith("lmsp-window") and n.replace(".", "", 1).isdigit() else None


def variant_env(name: str) -> dict[str, str]:
    window = window_variant(name)
    return {"LMSP_COMMIT_WINDOW_MS": window} if window is not None else LMSP_VARIANT_ENV.get(name, {})


def lmsp_argv(cmd: list[str], variant: str, data_dir: Path, port: int, model: Path) -> tuple[list[str], dict]:
    """The command that starts the service (and the environment it adds): ``lmsp serve``,
    or for a commit variant gunicorn as ``lmsp serve`` runs it, with the variant's app."""
    bind = f"127.0.0.1:{port}"
    app = COMMIT_VARIANTS.get(variant)
    if app is None:
        return [*cmd, "serve", "--data-dir", str(data_dir), "--bind", bind, "--model", str(model)], {}
    sibling = Path(cmd[0]).with_name("python")
    python = str(sibling) if len(cmd) == 1 and sibling.exists() else sys.executable
    path = os.pathsep.join(filter(None, (str(ROOT / "bench"), os.environ.get("PYTHONPATH"))))
    env = {"LMSP_DATA_DIR": str(data_dir), "LMSP_BIND": bind, "LMSP_MODEL": os.path.realpath(model),
           "PYTHONPATH": path}
    return [python, "-m", "gunicorn", "--config", "python:lmsp.serving.gunicorn_conf", app], env


class LmspServer(Server):
    name = "lmsp"

    @classmethod
    def create(cls, cmd: list[str], model: Path, s: ServeSettings, work: Path, variant: str,
               extra_env: dict[str, str]):
        port = free_port()
        data_dir = work / "data" / f"{variant}-{model.stem}"
        if data_dir.exists():
            shutil.rmtree(data_dir)
        data_dir.mkdir(parents=True)
        env = dict(os.environ)
        env.update({
            "LMSP_N_THREADS": str(s.threads), "LMSP_N_PARALLEL": str(s.parallel),
            "LMSP_N_CTX": str(s.ctx_per_seq), "LMSP_N_GPU_LAYERS": str(s.n_gpu_layers),
            "LMSP_WORKERS": "1", "LMSP_LOG_LEVEL": "warning",
        })
        env.update(variant_env(variant))
        env.update(extra_env)
        argv, started_as = lmsp_argv(cmd, variant, data_dir, port, model)
        env.update(started_as)
        srv = cls(argv, env, work / "logs" / f"{variant}-{model.stem}.log", work)
        srv.port, srv.cmd, srv.data_dir, srv.name = port, cmd, data_dir, variant
        return srv

    def ready(self, s: ServeSettings) -> None:
        self.wait_ready("/readyz", s.ready_timeout)

    def pair(self) -> str:
        out = subprocess.run([*self.cmd, "pair", "--data-dir", str(self.data_dir), "--scopes",
                              LMSP_SCOPES, "--json"], env=self.env, capture_output=True,
                             text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"lmsp pair failed ({out.returncode}): {out.stderr.strip()}")
        code = json.loads(out.stdout)["code"]
        status, body = http_json(self.port, "POST", "/v1/pair",
                                 {"code": code, "client_name": "bench-serve"})
        if status not in (200, 201) or not body or "token" not in body:
            raise RuntimeError(f"POST /v1/pair answered {status}: {body}")
        return body["token"]


def make_models(names: list[str], files: list[str], work: Path) -> list[Path]:
    """Catalog models (fetched into the cache), demo shapes (written under WORK) and files."""
    return [m.path for m in resolve(names, files, work / "models")]


# A model without a chat template: the service renders messages as
# "User: ...\n\nAssistant:" (csrc/engine.cpp, fallback_template); llama-server
# would fall back to another format. It gets the same one as a Jinja template,
# so that both tokenize the same text.
PLAIN_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}System"
    "{%- elif message['role'] == 'assistant' -%}Assistant"
    "{%- else -%}User{%- endif -%}"
    ": {{ message['content'] }}\n\n"
    "{% endfor -%}"
    "{%- if add_generation_prompt -%}Assistant:{%- endif -%}")


def llama_template_args(model: Path, work: Path) -> list[str]:
    """llama-server's arguments for the service's plain format where the model has no template."""
    if has_chat_template(model):
        return []
    path = work / "plain-chat-template.jinja"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PLAIN_CHAT_TEMPLATE)
    return ["--chat-template-file", str(path)]


