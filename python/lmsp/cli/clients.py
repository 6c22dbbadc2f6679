"""The ``lmsp clients`` commands: who may call the service and how much of the box
each may take.

    lmsp clients [list]                  the clients: priority, limits, last seen, tokens today
    lmsp clients revoke ID               its token stops working at once
    lmsp clients limit ID [--priority N] [--max-running N|none] [--max-queued N|none]
                          [--tokens-per-hour N|none]
    lmsp clients usage [--hours N]       each client's tasks and tokens, by hour
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from lmsp.cli.common import EXIT_OK, CommandError, _load_config, _open_store, _print, _table, _when

#: the limit options: (option, store name)
LIMIT_OPTIONS = (
    ("--priority", "priority"),
    ("--max-running", "max_running"),
    ("--max-queued", "max_queued"),
    ("--tokens-per-hour", "tokens_per_hour"),
)


def limit_value(text: str) -> int | None:
    """A limit as given: a whole number of at least 0, or ``none`` (no limit)."""
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'none', not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, not {value}")
    return value


def add_clients_command(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("clients", parents=[common], help="list, revoke or limit clients, or show their usage")
    p.add_argument("action", nargs="?", default="list", choices=["list", "revoke", "limit", "usage"])
    p.add_argument("id", nargs="?", default=None)
    p.add_argument("--priority", type=int, default=None, metavar="N", help="limit: turns at starting tasks, 1 to 100")
    for option, name in LIMIT_OPTIONS[1:]:
        p.add_argument(
            option, dest=name, type=limit_value, default=..., metavar="N|none", help="limit: 'none' takes it away"
        )
    p.add_argument("--hours", type=int, default=24, metavar="N", help="usage: the last N hours (default 24)")
    p.set_defaults(func=cmd_clients)


def cmd_clients(args: argparse.Namespace) -> int:
    cfg = _load_config(args)
    if args.action != "limit" and (
        args.priority is not None or any(getattr(args, n) is not ... for _, n in LIMIT_OPTIONS[1:])
    ):
        raise CommandError("--priority, --max-running, --max-queued and --tokens-per-hour go with clients limit")
    store = _open_store(cfg)
    try:
        if args.action == "revoke":
            if not args.id:
                raise CommandError("clients revoke needs a client id")
            client = store.revoke_client(args.id)
            _print(args, client, f"revoked {client['id']} ({client['name']})")
        elif args.action == "limit":
            _limit(args, store)
        elif args.action == "usage":
            _usage(args, store)
        else:
            _list(args, store.list_clients())
    finally:
        store.close()
    return EXIT_OK


def _list(args: argparse.Namespace, clients: list[dict[str, Any]]) -> None:
    rows = [
        [
            c["id"],
            c["name"],
            ",".join(c["scopes"]),
            c["priority"],
            _limits_text(c),
            _when(c["created_at"]),
            _when(c["last_seen_at"]) if c.get("last_seen_at") else "never",
            c["tokens_today"],
            _when(c["revoked_at"]) if c.get("revoked_at") else "",
        ]
        for c in clients
    ]
    header = ["ID", "NAME", "SCOPES", "PRIORITY", "LIMITS", "CREATED", "SEEN", "TODAY", "REVOKED"]
    _print(args, {"object": "list", "data": clients}, _table(rows, header))


def _limits_text(client: dict[str, Any]) -> str:
    given = [f"{name}={client[name]}" for _, name in LIMIT_OPTIONS[1:] if client.get(name) is not None]
    return " ".join(given) or "none"


def _limit(args: argparse.Namespace, store: Any) -> None:
    if not args.id:
        raise CommandError("clients limit needs a client id")
    limits: dict[str, int | None] = {n: getattr(args, n) for _, n in LIMIT_OPTIONS[1:] if getattr(args, n) is not ...}
    if args.priority is not None:
        limits["priority"] = args.priority
    if not limits:
        raise CommandError("clients limit needs one of --priority, --max-running, --max-queued, --tokens-per-hour")
    store.set_limits(args.id, **limits)
    client = next(c for c in store.list_clients() if c["id"] == args.id)
    _print(args, client, f"{client['id']} ({client['name']}): priority {client['priority']}, {_limits_text(client)}")


def _usage(args: argparse.Namespace, store: Any) -> None:
    if args.id:
        raise CommandError("clients usage takes no client id")
    if args.hours < 1:
        raise CommandError("--hours must be 1 or more")
    since = time.time() - (args.hours - 1) * 3600
    names = {c["id"]: c["name"] for c in store.list_clients()}
    rows = store.usage(since=since)
    for row in rows:
        row["client_name"] = names.get(row["client_id"])
    table = [[_when(r["hour_start"]), r["client_id"], r["client_name"], r["tasks"], r["tokens"]] for r in rows]
    text = _table(table, ["HOUR", "CLIENT", "NAME", "TASKS", "TOKENS"])
    _print(args, {"object": "list", "hours": args.hours, "data": rows}, text)
