"""``lmsp rpc-server``: this box's CPU lent to a model split over several boxes.

    lmsp rpc-server [--bind HOST:PORT] [--threads N] [--mem MIB] [--cache DIR] [--allow-public]

It runs ggml's RPC server from the extension (``lmsp.runtime.rpc.serve``), with
the engine's kernels, until SIGTERM or SIGINT. ggml's RPC protocol has no
authentication and trusts its peer: the server binds to loopback unless given
an address, and refuses an address that the internet could reach (or every
address, ``0.0.0.0``) without ``--allow-public``. docs/RPC.md says where it
belongs (a private network, or a tunnel).
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import sys
import threading
from typing import Any

from lmsp.cli.common import EXIT_OK, CommandError

DEFAULT_BIND = "127.0.0.1:50052"


def split_bind(bind: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPV6]:PORT`` as (host, port); a CommandError when it is neither."""
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise CommandError(f"--bind must be HOST:PORT (a port from 1 to 65535), not {bind!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


def public_addresses(host: str) -> list[str]:
    """The addresses ``host`` stands for that are not private: global ones, and the
    unspecified address (every interface). A name that does not resolve is a CommandError."""
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except socket.gaierror as exc:
        raise CommandError(f"--bind: cannot resolve {host}: {exc.strerror}") from None
    out = []
    for text in sorted(found):
        address = ipaddress.ip_address(text.split("%")[0])
        if address.is_unspecified or address.is_global:
            out.append(text)
    return out


def cpu_count() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cmd_rpc_server(args) -> int:
    from lmsp.runtime import rpc

    if not rpc.server_built():
        raise CommandError("this build of lmsp has no RPC backend (CMake option LMSP_RPC=OFF)")
    host, port = split_bind(args.bind)
    public = public_addresses(host)
    if public and not args.allow_public:
        raise CommandError(
            f"--bind {args.bind} is reachable beyond a private network ({', '.join(public)}) and ggml's "
            "RPC protocol has no authentication: bind a private address or a tunnel, or give --allow-public"
        )
    threads = args.threads if args.threads is not None else cpu_count()
    if threads < 1:
        raise CommandError("--threads must be at least 1")
    if args.mem is not None and args.mem < 1:
        raise CommandError("--mem must be at least 1 (MiB)")
    cache = ""
    if args.cache:
        os.makedirs(args.cache, exist_ok=True)
        cache = os.path.realpath(args.cache)
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return _serve(rpc, endpoint, threads, (args.mem or 0) << 20, cache)


def _serve(rpc: Any, endpoint: str, threads: int, mem_bytes: int, cache: str) -> int:
    """Runs the server on a thread of its own (it blocks in C++ without the GIL) and
    waits for it to fail or for SIGTERM/SIGINT; the server keeps nothing a stop could lose."""
    failed: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            rpc.serve(endpoint, cache_dir=cache, n_threads=threads, mem_bytes=mem_bytes)
        except Exception as exc:  # handed to the main thread, which reports it
            failed.append(exc)
        finally:
            done.set()

    stopped: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        stopped.append(signum)
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=run, name="rpc-server", daemon=True).start()
    print(
        f"lmsp rpc-server: lending this box's CPU ({threads} threads) on {endpoint}, RPC protocol {rpc.protocol()}",
        file=sys.stderr,
        flush=True,
    )
    while not done.wait(1.0):
        pass
    if failed and not stopped:
        raise CommandError(str(failed[0]))
    print(f"lmsp rpc-server: stopped ({signal.Signals(stopped[0]).name})", file=sys.stderr, flush=True)
    sys.stdout.flush()
    # the server thread sits in accept() or a computation, in C++: nothing to wind down
    os._exit(EXIT_OK)


def add_rpc_server_command(sub: Any) -> None:
    p = sub.add_parser(
        "rpc-server",
        help="lend this box's CPU to a model split over several boxes (ggml RPC: private networks only)",
    )
    p.add_argument(
        "--bind",
        default=DEFAULT_BIND,
        metavar="HOST:PORT",
        help=f"where to listen (default {DEFAULT_BIND}); an address beyond a private network needs --allow-public",
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: one per core)")
    p.add_argument("--mem", type=int, default=None, metavar="MIB", help="memory to offer (default: what is free)")
    p.add_argument("--cache", default=None, metavar="DIR", help="keep large tensors clients send here, by hash")
    p.add_argument(
        "--allow-public",
        action="store_true",
        help="listen on an address beyond a private network (ggml RPC has no authentication)",
    )
    p.set_defaults(func=cmd_rpc_server)
