"""The ``lmsp fleet`` commands: one key for the boxes of a fleet, and the nginx in front.

lmsp fleet init --data-dir DIR               a new fleet key in DIR/fleet.key (0600)
lmsp fleet join --data-dir DIR --key FILE    another box's fleet key for this box
lmsp fleet nginx --listen HOST:PORT --box ID=HOST:PORT ... [--site]
                 [--tls-cert FILE --tls-key FILE]
                                             the fleet's nginx configuration, on stdout
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from lmsp.cli.common import EXIT_OK, CommandError, _load_config, _print


def add_fleet_command(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("fleet", parents=[common], help="the fleet key, and the nginx in front of the boxes")
    p.add_argument("action", choices=["init", "join", "nginx"])
    p.add_argument("--key", default=None, metavar="FILE", help="join: the fleet.key of a box of the fleet")
    p.add_argument("--listen", default=None, metavar="HOST:PORT", help="nginx: where the router listens")
    p.add_argument(
        "--box", action="append", default=[], metavar="ID=HOST:PORT", help="nginx: a box of the fleet (each one)"
    )
    p.add_argument("--site", action="store_true", help="nginx: only the part to include in http {}")
    p.add_argument("--tls-cert", default=None, metavar="FILE", help="nginx: listen with TLS (with --tls-key)")
    p.add_argument("--tls-key", default=None, metavar="FILE")
    p.set_defaults(func=cmd_fleet)


def cmd_fleet(args: argparse.Namespace) -> int:
    from lmsp.fleet import keys, nginx

    if args.action == "nginx":
        try:
            fleet = nginx.parse(args.listen or "", args.box, args.tls_cert, args.tls_key)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        sys.stdout.write(nginx.site(fleet) if args.site else nginx.whole(fleet))
        return EXIT_OK
    cfg = _load_config(args)
    try:
        if args.action == "init":
            path = keys.init(cfg.data_dir)
        else:
            if not args.key:
                raise CommandError("fleet join needs --key FILE (the fleet.key of a box of the fleet)")
            path = keys.join(cfg.data_dir, Path(args.key))
    except keys.FleetKeyError as exc:
        raise CommandError(str(exc)) from None
    _print(args, {"fleet_key": str(path)}, f"fleet key: {path}")
    return EXIT_OK
