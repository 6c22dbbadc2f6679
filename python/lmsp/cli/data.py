"""The ``lmsp`` commands on what the data directory holds: models (list, add, remove,
pull), tasks (list, show, cancel), gc, doctor, and quantize."""

from __future__ import annotations

import os
import sqlite3
import sys
import time

from lmsp import config as _config
from lmsp import kv
from lmsp.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    CommandError,
    _database,
    _load_config,
    _model_path,
    _open_store,
    _print,
    _Progress,
    _table,
    _when,
)


# ---------------------------------------------------------------------- models
def cmd_models(args) -> int:
    from lmsp.runtime import ModelRegistry

    cfg = _load_config(args)
    if args.action == "pull":
        return _pull(args, cfg)
    if args.list:
        raise CommandError("--list goes with models pull")
    store = _open_store(cfg)
    try:
        registry = ModelRegistry(cfg, store)
        if args.action == "add":
            if not args.target:
                raise CommandError("models add needs a GGUF file")
            path = _model_path(cfg, args.target)
            progress = _Progress(f"sha256 {os.path.basename(path)}", enabled=not args.json and sys.stderr.isatty())
            servers = _config.split_rpc_servers(args.rpc) if args.rpc else None
            shares = [float(x) for x in args.tensor_split.split(",")] if args.tensor_split else None
            model = registry.register(
                os.path.abspath(path), args.id, progress, confined=False, rpc_servers=servers, tensor_split=shares
            )
            _print(
                args,
                model,
                f"registered {model['id']}: {model['architecture']}, {model['quantization']}, "
                f"{model['size_bytes']} bytes, {model['digest']}",
            )
            return EXIT_OK
        if args.action == "remove":
            if not args.target:
                raise CommandError("models remove needs a model id")
            store.delete_model(args.target)
            _print(
                args,
                {"id": args.target, "object": "model", "deleted": True},
                f"removed {args.target} (the file is left alone)",
            )
            return EXIT_OK
        models = registry.objects()
    finally:
        store.close()
    rows = [
        [
            m["id"],
            m["state"],
            m["architecture"],
            m["quantization"],
            m["parameters"],
            m["size_bytes"],
            (m["digest"] or "")[:19],
        ]
        for m in models
    ]
    _print(
        args,
        {"object": "list", "data": models},
        _table(rows, ["ID", "STATE", "ARCH", "QUANT", "PARAMS", "BYTES", "DIGEST"]),
    )
    return EXIT_OK


def _pull(args, cfg) -> int:
    from lmsp.models import catalog
    from lmsp.models import pull

    try:
        if args.list:
            data, rows = pull.listing()
            _print(
                args,
                {"object": "list", "data": data},
                _table(rows, ["NAME", "SIZE", "LICENCE", "ARCH", "CACHED", "DESCRIPTION"]),
            )
            return EXIT_OK
        if not args.target:
            raise CommandError("models pull needs a model name (lmsp models pull --list shows the catalog)")
        if args.id:
            raise CommandError("a pulled model's id is its catalog name; --id goes with models add")
        model = catalog.lookup(args.target)
        store = _open_store(cfg)  # before any download: a pull registers what it fetched
        try:
            reporter = pull.Reporter(bar=pull.interactive(args.json), json_lines=args.json)
            path = pull.fetch(model, cfg.models_dir, reporter)
            out = pull.register(cfg, store, model, path, reporter)
        finally:
            store.close()
    except catalog.CatalogError as exc:
        raise CommandError(str(exc)) from None
    _print(
        args,
        out,
        f"{model.name}: {out['architecture']}, {out['quantization']}, {out['size_bytes']:,} bytes, "
        f"{model.license}, in {path}",
    )
    return EXIT_OK


# ---------------------------------------------------------------------- tasks
def cmd_tasks(args) -> int:
    cfg = _load_config(args)
    store = _open_store(cfg)
    try:
        if args.action in ("show", "cancel"):
            if not args.id:
                raise CommandError(f"tasks {args.action} needs a task or response id")
            if args.action == "cancel":
                task = store.cancel(args.id)
            else:
                task = store.get_task(store.task_id_for_response(args.id) if args.id.startswith("resp_") else args.id)
            response = store.get_response(task["response_id"])
            out = {**task, "response": response}
            text = "\n".join(
                [
                    f"task      {task['id']}  {task['status']}  on_restart={task['on_restart']}  "
                    f"attempts={task['attempts']}",
                    f"response  {response['id']}  {response['status']}  model={response['model']}",
                    f"created   {_when(task['created_at'])}  finished {_when(task['finished_at'])}",
                    f"events    {task['last_sequence_number']}",
                ]
                + ([f"error     {task['error']['code']}: {task['error']['message']}"] if task.get("error") else [])
            )
            _print(args, out, text)
            return EXIT_OK
        page = store.list_tasks(None, status=args.status, limit=args.limit)
    finally:
        store.close()
    rows = [
        [
            t["id"],
            t["status"],
            t["on_restart"],
            t["attempts"],
            t["last_sequence_number"],
            _when(t["created_at"]),
            t["response_id"],
        ]
        for t in page["data"]
    ]
    _print(args, page, _table(rows, ["ID", "STATUS", "ON_RESTART", "ATTEMPTS", "EVENTS", "CREATED", "RESPONSE"]))
    return EXIT_OK


# ---------------------------------------------------------------------- gc
def cmd_gc(args) -> int:
    cfg = _load_config(args)
    days = cfg.retention_days if args.retention_days is None else args.retention_days
    if not 0 <= days < float("inf"):  # (NaN fails too)
        raise CommandError("--retention-days must be a number of days, 0 or more")
    store = _open_store(cfg)
    try:
        counts = store.gc(retention=days * 86400.0)
        models = {row["digest"] for row in store.list_models()}
        # the KV files: those of models no longer registered, of deleted conversations
        # and chains, and beyond the budget
        budget = kv.resolve_budget(cfg.kv_cache_bytes, cfg.data_dir) if cfg.prefix_cache else 0
        counts.update(kv.gc(cfg.kv_dir, budget, models, store.kv_owners_existing))
    finally:
        store.close()
    out = {"retention_days": days, "deleted": counts}
    _print(args, out, "deleted: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return EXIT_OK


# ---------------------------------------------------------------------- doctor
def cmd_doctor(args) -> int:
    from lmsp.runtime import ModelRegistry, file_digest

    cfg = _load_config(args)
    db_path = _database(cfg)
    # as a URI (read-only), with '#', '?' and '%' in the path escaped
    conn = sqlite3.connect(db_path.resolve().as_uri() + "?mode=ro", uri=True, timeout=cfg.busy_timeout)
    try:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
        fk = conn.execute("PRAGMA foreign_key_check").fetchall()
    except sqlite3.DatabaseError as exc:
        rows, fk = [(f"unreadable: {exc}",)], []
    finally:
        conn.close()
    integrity = "ok" if [r[0] for r in rows] == ["ok"] and not fk else "; ".join(str(r[0]) for r in rows[:10])
    if fk:
        integrity += f"; {len(fk)} foreign key violation(s)"
    store = _open_store(cfg)
    models = []
    try:
        registry = ModelRegistry(cfg, store)
        for row in store.list_models():
            path = registry.file_path(row)
            if not path.is_file():
                status = "missing"
            else:
                digest, _ = file_digest(path)
                status = "ok" if digest == row["digest"] else "changed"
            models.append({"id": row["id"], "path": str(path), "status": status})
    finally:
        store.close()
    healthy = integrity == "ok" and all(m["status"] == "ok" for m in models)
    out = {"ok": healthy, "database": {"path": str(db_path), "integrity": integrity}, "models": models}
    lines = [f"database  {db_path}: {integrity}"]
    lines += [f"model     {m['id']}: {m['status']} ({m['path']})" for m in models] or ["model     (none registered)"]
    lines.append("healthy" if healthy else "PROBLEMS FOUND")
    _print(args, out, "\n".join(lines))
    return EXIT_OK if healthy else EXIT_ERROR


# ---------------------------------------------------------------------- quantize
def cmd_quantize(args) -> int:
    from lmsp.runtime.quantize import quantize_file

    src = _model_path(_load_config(args), args.src)
    folder = os.path.dirname(os.path.abspath(args.dst))
    if not os.path.isdir(folder):
        raise CommandError(f"cannot write {args.dst}: no such directory: {folder}")
    if os.path.isdir(args.dst):
        raise CommandError(f"cannot write {args.dst}: it is a directory (name the file to write)")
    if os.path.exists(args.dst) and not args.force:
        raise CommandError(f"{args.dst} exists (--force replaces it)")
    started = time.monotonic()
    try:
        info = quantize_file(src, args.dst, args.type.lower(), args.threads)  # Q8_0 as `lmsp models` shows it
    except ValueError as exc:  # refused by the engine
        raise CommandError(str(exc)) from None
    out = {
        "path": os.path.abspath(args.dst),
        "quantization": info["quantization"],
        "size_bytes": info["size_bytes"],
        "source_bytes": os.path.getsize(src),
        "seconds": round(time.monotonic() - started, 2),
    }
    _print(
        args,
        out,
        f"wrote {args.dst}: {out['quantization']}, {out['size_bytes']:,} bytes "
        f"(from {out['source_bytes']:,}) in {out['seconds']} s",
    )
    return EXIT_OK
