"""The ``lmsp`` command: run the service, and operate it on the box.

    lmsp serve   --data-dir DIR --bind HOST:PORT [--model FILE|NAME] [--workers N] [--max-attempts N]
                 [--box-id ID] [--peer ID=HOST:PORT ...]      a box of a fleet
    lmsp fleet   [init | join --key FILE | nginx --listen HOST:PORT --box ID=HOST:PORT ...]
    lmsp pair    --scopes SCOPE[,SCOPE...] [--name NAME]     a one-time pairing code
    lmsp clients [list | revoke CLIENT_ID | usage [--hours N]]
    lmsp clients limit CLIENT_ID [--priority N] [--max-running N|none] [--max-queued N|none]
                 [--tokens-per-hour N|none]                  its share of the box
    lmsp models  [list | add FILE [--id ID] [--rpc HOST:PORT,...] | remove MODEL_ID | pull NAME | pull --list]
    lmsp tasks   [list [--status S] [--limit N] | show TASK_ID | cancel TASK_ID]
    lmsp gc      [--retention-days DAYS]                      apply retention now
    lmsp doctor                                               database integrity, model files and digests
    lmsp quantize SRC DST --type TYPE [--threads N]           a model's weights written again in TYPE
    lmsp rpc-server [--bind HOST:PORT] [--threads N] [--mem MIB] [--cache DIR] [--allow-public]
                                                              this box's CPU lent to a split model

Every command takes ``--data-dir`` (or ``LMSP_DATA_DIR``). The operator
commands work on the store directly (no server needed), but only on a database
the service (or ``lmsp prepare``) made: they never create one; with ``--json`` each
prints exactly one JSON object on stdout. Errors go to stderr (or, with
``--json``, as ``{"error": {...}}``) with exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from typing import TypeAlias

from lmsp import config as _config
from lmsp.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    _load_config,
    _open_store,
    _print,
    _when,
)
from lmsp.cli.clients import add_clients_command
from lmsp.cli.fleet import add_fleet_command
from lmsp.cli.data import cmd_doctor, cmd_gc, cmd_models, cmd_quantize, cmd_tasks
from lmsp.cli.rpc_server import add_rpc_server_command
from lmsp.datadir import private_umask
from lmsp.errors import LMSPError
from lmsp.store import StoreError
from lmsp.store.states import STATES


# ---------------------------------------------------------------------- serve
def cmd_serve(args) -> int:
    cfg = _load_config(args)
    env = os.environ.copy()
    env["LMSP_DATA_DIR"] = str(cfg.data_dir.resolve())
    env["LMSP_BIND"] = cfg.bind
    model = _served_model(cfg, args.default_model)
    if model:
        env["LMSP_MODEL"] = model
    if args.workers is not None:
        env["LMSP_WORKERS"] = str(args.workers)
    if args.log_level is not None:
        env["LMSP_LOG_LEVEL"] = args.log_level
    if args.max_attempts is not None:
        env["LMSP_MAX_ATTEMPTS"] = str(cfg.max_attempts)
    if args.box_id is not None:
        env["LMSP_BOX_ID"] = cfg.box_id
    if args.peer:
        env["LMSP_PEERS"] = cfg.peers
    if args.rpc is not None:
        env["LMSP_RPC_SERVERS"] = cfg.rpc_servers
    if args.tensor_split is not None:
        env["LMSP_TENSOR_SPLIT"] = cfg.tensor_split
    if args.rpc_timeout is not None:
        env["LMSP_RPC_TIMEOUT"] = str(cfg.rpc_timeout)
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "gunicorn", "--config", "python:lmsp.serving.gunicorn_conf"]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)  # the master keeps this pid (systemd, signals)
    return EXIT_ERROR  # pragma: no cover


def _served_model(cfg, default: str | None) -> str | None:
    """The real path of the model file to serve: the one configured (a file, or a catalog
    model's name, pulled into the models directory on first use), else ``default`` (a catalog
    name; when it cannot be had the service makes its demo model instead), else none."""
    from lmsp.models import catalog
    from lmsp.models import pull

    given = str(cfg.model) if cfg.model else None
    try:
        wanted = given or default
        model = pull.catalog_name(wanted) if wanted else None
        if model is not None:
            reporter = pull.Reporter(bar=pull.interactive(False), json_lines=False)
            return os.path.realpath(pull.fetch(model, cfg.models_dir, reporter))
    except catalog.CatalogError as exc:
        if given:
            raise CommandError(f"--model {given}: {exc}") from None
        print(f"lmsp serve: {default} cannot be had ({exc}); serving the demo model", file=sys.stderr)
        return None
    if not given:
        return None
    path = os.path.realpath(os.path.expanduser(given))
    if os.path.isdir(path):
        raise CommandError(f"--model: {given} is a directory; name a GGUF file")
    if not os.path.isfile(path):
        raise CommandError(f"--model: no such file, nor a model of the catalog (lmsp models pull --list): {given}")
    return path


# ---------------------------------------------------------------------- prepare
def cmd_prepare(args) -> int:
    from lmsp.datadir import DataDirInUse, hold_data_dir
    from lmsp.runtime.startup import StartupError, open_store, prepare

    cfg = _load_config(args)
    try:
        lock = hold_data_dir(cfg.data_dir)  # no service may run on the directory meanwhile
        try:
            store = open_store(cfg)
            try:
                report = prepare(cfg, store)
            finally:
                store.close()
        finally:
            os.close(lock)
    except (DataDirInUse, StartupError) as exc:
        raise CommandError(str(exc)) from None
    counts = {key: len(value) for key, value in report.items() if isinstance(value, list)}
    _print(
        args,
        {"recovered": counts},
        "start-up recovery: " + (", ".join(f"{k} {v}" for k, v in counts.items() if v) or "nothing to do"),
    )
    return EXIT_OK


# ---------------------------------------------------------------------- pair
def cmd_pair(args) -> int:
    from lmsp import auth

    cfg = _load_config(args)
    scopes = [s.strip() for s in (args.scopes or "").split(",") if s.strip()]
    unknown = [s for s in scopes if s not in auth.SCOPES]
    if not scopes or unknown:
        raise CommandError(
            f"--scopes takes a comma-separated list of: {', '.join(auth.SCOPES)}"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    ttl = cfg.pairing_ttl_seconds if args.ttl is None else args.ttl
    if ttl <= 0:
        raise CommandError("--ttl must be a positive number of seconds")
    store = _open_store(cfg)
    try:
        code = auth.boxed_code(auth.new_pairing_code(), cfg.box_id)
        expires_at = int(time.time() + ttl)
        store.create_pairing(code_hash=auth.hash_code(code), scopes=scopes, expires_at=expires_at, name=args.name)
    finally:
        store.close()
    out = {"code": code, "expires_at": expires_at, "scopes": scopes, "name": args.name}
    _print(
        args,
        out,
        f"pairing code: {code}\nscopes: {', '.join(scopes)}\nexpires: {_when(expires_at)} "
        f"(single use; the client sends it to POST /v1/pair)",
    )
    return EXIT_OK


# ---------------------------------------------------------------------- parser
class _CommandParser(argparse.ArgumentParser):
    """A command's parser: options and positionals in any order (``models add --data-dir
    DIR FILE --id ID``), and what it cannot parse refused with the command's own usage."""

    _intermixed = False

    def parse_known_args(self, args=None, namespace=None):
        if self._intermixed:  # the passes of parse_known_intermixed_args itself
            return super().parse_known_args(args, namespace)
        self._intermixed = True
        try:
            namespace, extras = self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixed = False
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


_Subcommands: TypeAlias = "argparse._SubParsersAction[_CommandParser]"


def build_parser() -> argparse.ArgumentParser:
    data_dir = _CommandParser(add_help=False)
    data_dir.add_argument("--data-dir", default=None, help="the data directory (env LMSP_DATA_DIR; default ./data)")
    common = _CommandParser(add_help=False, parents=[data_dir])
    common.add_argument("--json", action="store_true", help="print one JSON object")

    parser = argparse.ArgumentParser(prog="lmsp", description="A durable local model service (LMSP 1.0).")
    parser.add_argument("--version", action="version", version=f"lmsp {__import__('lmsp').__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    _add_service_commands(sub, data_dir, common)
    _add_client_commands(sub, common)
    _add_data_commands(sub, common)
    _add_quantize_command(sub, common)
    add_rpc_server_command(sub)
    return parser


def _add_more_than_one_box(p: _CommandParser) -> None:
    """Serve's options for more than one box: a fleet's ids and peers, a model split over
    rpc-servers."""
    p.add_argument(
        "--box-id",
        default=None,
        metavar="ID",
        help="this box's id in a fleet, carried by every id it makes: 1 to 8 of a-z 0-9 (env LMSP_BOX_ID)",
    )
    p.add_argument(
        "--peer",
        action="append",
        default=None,
        metavar="ID=HOST:PORT",
        help="another box of the fleet (repeat for each; env LMSP_PEERS, comma-separated)",
    )
    p.add_argument(
        "--rpc",
        default=None,
        metavar="HOST:PORT[,...]",
        help="lmsp rpc-server processes to split each model's layers over, with this box "
        "(env LMSP_RPC_SERVERS; needs --workers 1)",
    )
    p.add_argument(
        "--tensor-split",
        default=None,
        metavar="SHARES",
        help="with --rpc: this box's share of the layers, then each server's, e.g. 2,1,1 "
        "(env LMSP_TENSOR_SPLIT; default: by each one's free memory)",
    )
    p.add_argument(
        "--rpc-timeout",
        default=None,
        metavar="SECONDS",
        help="with --rpc: a server that owes an answer and sends nothing this long is lost "
        "(env LMSP_RPC_TIMEOUT; default 60)",
    )


def _add_service_commands(sub: _Subcommands, data_dir: _CommandParser, common: _CommandParser) -> None:
    """Serve and prepare: running the service."""
    p = sub.add_parser("serve", parents=[data_dir], help="run the service (gunicorn, gevent workers)")
    p.add_argument("--bind", default=None, help="HOST:PORT (env LMSP_BIND; default 127.0.0.1:8080)")
    p.add_argument(
        "--model",
        default=None,
        help="a GGUF file to register (id = its name) and serve, or the name "
        "of a catalog model (lmsp models pull --list), fetched into the data directory on first use",
    )
    p.add_argument(
        "--default-model",
        default=None,
        metavar="NAME",
        help="a catalog model to serve when no model is configured; when it cannot be had, "
        "the demo model is served instead",
    )
    p.add_argument("--workers", type=int, default=None, help="worker processes (each holds its own model copy)")
    p.add_argument("--log-level", default=None, choices=_config.LOG_LEVELS)
    p.add_argument(
        "--max-attempts",
        type=int,
        default=None,
        metavar="N",
        help="starts of a task whose worker stops while it runs, then it fails with attempts_exhausted "
        "(env LMSP_MAX_ATTEMPTS; default 3)",
    )
    _add_more_than_one_box(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "prepare",
        parents=[common],
        help="prepare the data directory and models and run start-up recovery (serve does it too)",
    )
    p.set_defaults(func=cmd_prepare)


def _add_client_commands(sub: _Subcommands, common: _CommandParser) -> None:
    """Pair and clients: who may call the service."""
    p = sub.add_parser("pair", parents=[common], help="make a one-time pairing code")
    p.add_argument("--scopes", required=True, help="comma-separated: responses:write,responses:read,...")
    p.add_argument("--name", default=None, help="a note on what the code is for")
    p.add_argument("--ttl", type=int, default=None, help="seconds the code stays valid")
    p.set_defaults(func=cmd_pair)

    add_clients_command(sub, common)
    add_fleet_command(sub, common)


def _add_data_commands(sub: _Subcommands, common: _CommandParser) -> None:
    """Models, tasks, gc and doctor: what the data directory holds."""
    p = sub.add_parser("models", parents=[common], help="list, add, remove or pull models")
    p.add_argument("action", nargs="?", default="list", choices=["list", "add", "remove", "pull"])
    p.add_argument(
        "target", nargs="?", default=None, help="add: a GGUF file; remove: a model id; pull: a catalog model's name"
    )
    p.add_argument("--list", action="store_true", help="pull: show the catalog")
    p.add_argument("--id", default=None, help="add: the model id (default: the file name without .gguf)")
    p.add_argument(
        "--rpc",
        default=None,
        metavar="HOST:PORT[,...]",
        help="add: lmsp rpc-server processes to split this model over (default: the rpc_servers setting)",
    )
    p.add_argument(
        "--tensor-split", default=None, metavar="SHARES", help="add: with --rpc, this box's share, then each server's"
    )
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("tasks", parents=[common], help="list, show or cancel tasks")
    p.add_argument("action", nargs="?", default="list", choices=["list", "show", "cancel"])
    p.add_argument("id", nargs="?", default=None)
    p.add_argument(
        "--status",
        default=None,
        choices=STATES,
        metavar="STATUS",
        help=f"list: only tasks in this state ({', '.join(STATES)})",
    )
    p.add_argument("--limit", type=int, default=20, help="list: how many, 1 to 100 (default 20)")
    p.set_defaults(func=cmd_tasks)

    p = sub.add_parser(
        "gc", parents=[common], help="delete finished tasks past retention now, and KV files beyond their budget"
    )
    p.add_argument(
        "--retention-days",
        type=float,
        default=None,
        help="delete finished tasks (their events and responses too) older than this many days "
        "(default: the retention_days setting)",
    )
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("doctor", parents=[common], help="check the database and every model file")
    p.set_defaults(func=cmd_doctor)


def _add_quantize_command(sub: _Subcommands, common: _CommandParser) -> None:
    """Quantize: a model written again with its weights in another type."""
    p = sub.add_parser("quantize", parents=[common], help="write a GGUF model again with its weights in another type")
    p.add_argument("src", help="the GGUF model to read (a name inside the models directory will do)")
    p.add_argument("dst", help="the GGUF file to write")
    p.add_argument(
        "--type",
        required=True,
        help="the weights' type as llama.cpp names it, in any case: q4_k_m, "
        "q5_k_m, q6_k, q8_0, f16, ... (lmsp.native.QUANTIZE_TYPES)",
    )
    p.add_argument("--threads", type=int, default=0, help="threads to quantize on (default: one per core)")
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.set_defaults(func=cmd_quantize)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    # what any command makes (the database and its directories, a model file) is the service
    # user's alone: the database holds every client's prompts and answers, the data directory
    # the admin token; `serve` execs gunicorn with this mask
    umask = private_umask()
    try:
        return args.func(args)
    except (CommandError, LMSPError, StoreError, OSError, sqlite3.Error, ValueError) as exc:
        message = exc.message if isinstance(exc, LMSPError) else str(exc)
        code = exc.code if isinstance(exc, LMSPError) else "command_failed"
        if getattr(args, "json", False):
            print(json.dumps({"error": {"code": code, "message": message}}))
        else:
            print(f"lmsp {args.command}: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    finally:
        os.umask(umask)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
