"""The shipped gunicorn configuration: ``gunicorn -c python:lmsp.serving.gunicorn_conf``.

``lmsp serve`` runs gunicorn with this file. Its app is ``lmsp.app:get_app()``;
gunicorn's APP argument takes its place (``gunicorn -c python:lmsp.serving.gunicorn_conf
MODULE:FACTORY()``), with the same settings. Every setting comes from the
service configuration (``lmsp.config.load``: defaults, ``DATA_DIR/lmsp.toml``,
``LMSP_*`` environment variables); a few gunicorn-only knobs have their own
``LMSP_GUNICORN_*`` variables.

What happens where:

* the **master** (``on_starting``) has a child process prepare the data
  directory, the bootstrap admin credential and the models, and run start-up
  recovery (LMSP 11.3), exactly once per service start, before any worker
  forks; the master itself never opens the store, never loads an engine and
  never imports gevent (:mod:`lmsp.serving.gunicorn_worker`), so it stays small;
* each **worker** (gevent; one by default, since each worker holds its own copy
  of the model) builds the app, whose runtime starts its engine and loops
  after the fork;
* a worker that exits stops its runtime gracefully (``worker_exit``); a worker
  that dies is replaced, and its tasks are recovered through their expired
  leases by the surviving runtimes (LMSP B.9).
"""

from __future__ import annotations

import gc
import logging
import math
import os
import sys
import threading
import traceback

from lmsp import config as _config
from lmsp import cpu_check
from lmsp.datadir import private_umask as _private_umask

_cfg = _config.load()
_env = os.environ.get
# what the service writes (the database, the data directory) is its user's alone, whether it
# was started by `lmsp serve` (which sets the same mask) or by gunicorn directly
_private_umask()
# the data directory's lock (lmsp.datadir.hold_data_dir), taken in on_starting; the
# processes of a service killed just before may take a few seconds to let go of it
_data_lock: int | None = None
_DATA_LOCK_WAIT = 10.0

wsgi_app = "lmsp.app:get_app()"
bind = [_cfg.bind]
workers = _cfg.workers
worker_class = "lmsp.serving.gunicorn_worker.GeventWorker"  # gunicorn's gevent worker, imported after the fork
# connections a worker keeps open; those waiting for a request are at most max_idle_connections
# of them (lmsp.serving.idle_connections), so the rest stay for requests being served
worker_connections = int(_env("LMSP_GUNICORN_WORKER_CONNECTIONS", "2048"))
# Under gevent the worker's heartbeat runs in its own greenlet, so a long SSE
# stream never trips this; only a hub blocked for this long gets the worker killed.
timeout = int(_env("LMSP_GUNICORN_TIMEOUT", "60"))
# a stopping worker's time: stop_grace_seconds for its running tasks, then the rest to end its
# streams and stop its runtime (lmsp.serving.winddown); the master kills it after this
graceful_timeout = int(_env("LMSP_GUNICORN_GRACEFUL_TIMEOUT") or math.ceil(_cfg.stop_grace_seconds) + 5)
# longer than a proxy's idle upstream keepalive; at least 1 s (0 would leave a new connection's
# wait for its first request without any time limit in gunicorn's gevent worker)
keepalive = max(1, int(_env("LMSP_GUNICORN_KEEPALIVE", "75")))
preload_app = False  # the engine loads after fork, never in the master
loglevel = _cfg.log_level
accesslog = _env("LMSP_GUNICORN_ACCESSLOG") or None  # the app logs requests itself
errorlog = "-"
proc_name = f"lmsp[{_cfg.name}]"
forwarded_allow_ips = _env("LMSP_GUNICORN_FORWARDED_ALLOW_IPS", "127.0.0.1,::1")
limit_request_line = 8190
# gunicorn's control socket (gunicornc) only where the operator asks for it
control_socket = _env("LMSP_GUNICORN_CONTROL_SOCKET") or str(_cfg.data_dir / "gunicorn.ctl")
control_socket_disable = not _env("LMSP_GUNICORN_CONTROL_SOCKET")


def _enough_files() -> None:
    """Raise this process's open-file limit (which the workers inherit) to what
    ``worker_connections`` needs, within the hard limit."""
    import resource

    want = worker_connections + 256  # the database, the model, the log, gunicorn's own
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass


_enough_files()
try:  # the workers load the extension: a build for another CPU stops the master at once, in one line
    cpu_check.check()
except cpu_check.CpuMismatch as _exc:
    raise SystemExit(f"lmsp: cannot start: {_exc}") from None
if _cfg.max_idle_connections >= worker_connections:
    raise SystemExit(
        f"lmsp: cannot start: max_idle_connections ({_cfg.max_idle_connections}) must be "
        f"below LMSP_GUNICORN_WORKER_CONNECTIONS ({worker_connections})"
    )


def _logging() -> None:
    try:
        from lmsp.api.logs import configure_logging
    except ImportError:  # pragma: no cover - the web layer ships it
        logging.basicConfig(level=_cfg.log_level.upper())
    else:
        configure_logging(_cfg.log_level)


def on_starting(server) -> None:
    """Master, once per service start: data dir, identity, bootstrap admin, models, start-up recovery.

    They run in a child process (``lmsp prepare``, the same configuration from
    the same environment), so that what they import and
    touch (SQLite, the native module reading the model) stays out of the
    master, whose memory every worker's fork starts from. The environment then
    tells the workers that recovery already ran.
    """
    _logging()
    import json
    import subprocess

    from lmsp.datadir import LOCK_FD_ENV, DataDirInUse, hold_data_dir

    global _data_lock
    try:
        # held by the master (and inherited by every worker) for the service's life
        _data_lock = hold_data_dir(_cfg.data_dir, wait=_DATA_LOCK_WAIT)
    except DataDirInUse as exc:
        server.log.error("lmsp: cannot start: %s", exc)
        raise SystemExit(f"lmsp: cannot start: {exc}") from None
    env = dict(os.environ, **{LOCK_FD_ENV: str(_data_lock)})
    child = subprocess.run(
        [sys.executable, "-m", "lmsp.cli", "prepare", "--json"],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        check=False,
        env=env,
        pass_fds=(_data_lock,),
    )
    try:
        outcome = json.loads(child.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        outcome = {}
    if child.returncode != 0 or "recovered" not in outcome:
        message = (outcome.get("error") or {}).get(
            "message"
        ) or f"the start-up preparation exited with status {child.returncode}"
        server.log.error("lmsp: cannot start: %s", message)
        raise SystemExit(f"lmsp: cannot start: {message}")
    os.environ[_config.RECOVERED_ENV] = "1"
    counts = outcome.get("recovered") or {}
    server.log.info(
        "lmsp: start-up recovery done (%s)", ", ".join(f"{k}={v}" for k, v in counts.items() if v) or "nothing"
    )


def pre_fork(server, worker) -> None:
    """Master, before each fork: its objects go to the collector's permanent generation,
    so that the worker's collections never write to their pages, and the pages the two
    processes share stay shared."""
    gc.freeze()


def post_fork(server, worker) -> None:
    """Worker, right after fork: logging only (the app and its runtime are built next)."""
    _logging()


def post_worker_init(worker) -> None:
    """Worker, app loaded: say which runtime serves."""
    from lmsp.runtime import core

    for runtime in core.started():
        worker.log.info("lmsp: worker %s runs runtime %s", worker.pid, runtime.owner)


def worker_exit(server, worker) -> None:
    """Worker, exiting: stop claiming, commit what is produced, release the claims.

    After a SIGTERM, first the worker's wind-down (its running tasks' grace
    period, its streams ended: :mod:`lmsp.serving.winddown`). Tasks still running stay
    in the store and follow their restart policy at the next start (or are
    recovered by another worker when their lease expires).
    """
    from lmsp.runtime import core

    wind_down = getattr(worker, "wind_down", None)
    if wind_down is not None:  # a SIGTERM: the running tasks had their grace, the streams ended
        wind_down.wait()
        left = wind_down.time_left() - 1.0
    else:
        left = graceful_timeout / 2
    for runtime in core.started():
        runtime.stop(timeout=max(1.0, left))


def _dump_stacks(worker, why: str) -> None:
    frames = sys._current_frames()
    from lmsp.runtime._threads import thread_names

    names = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
    names.update(thread_names())
    lines = [f"lmsp: worker {worker.pid} {why}; stacks follow"]
    for ident, frame in frames.items():
        lines.append(f"--- thread {names.get(ident, ident)} ---")
        lines.extend(line.rstrip() for line in traceback.format_stack(frame))
    try:
        from gevent import util

        lines.append("--- greenlets ---")
        # (the stubs say it returns None; it returns the lines)
        lines.extend(util.format_run_info())  # type: ignore[func-returns-value,arg-type]
    except Exception:  # gevent missing or the hub is gone: the threads above are what we have
        pass
    worker.log.warning("\n".join(lines))


def worker_int(worker) -> None:
    """Worker got SIGINT/SIGQUIT: dump every thread's and greenlet's stack to the log."""
    _dump_stacks(worker, "interrupted")


def worker_abort(worker) -> None:
    """Worker got SIGABRT (a heartbeat timeout): dump the stacks, then it dies."""
    _dump_stacks(worker, "timed out")
