"""Once per service start: data directory, identity, bootstrap admin, models, recovery.

Under gunicorn this runs in the master before the workers fork (see
``lmsp.serving.gunicorn_conf``); a process that serves on its own runs it from
``Runtime.start()``. Nothing here loads an engine.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..errors import LMSPError, NotFound

log = logging.getLogger("lmsp.runtime")

BOOTSTRAP_SETTING = "bootstrap_admin_client"
DEMO_MODEL_ID = "demo"


class StartupError(RuntimeError):
    """The service cannot start as configured (the message says why)."""


def open_store(config):
    """The store of ``config`` with its durability, timeouts and key lifetime."""
    from .. import ids
    from ..store import Store

    ids.set_box(config.box_id)  # every id this process makes carries it
    return Store.open(
        config.db_path,
        durability=config.durability,
        busy_timeout=config.busy_timeout,
        idempotency_ttl=float(config.idempotency_ttl_hours) * 3600.0,
    )


def ensure_dirs(config) -> None:
    for path in (config.data_dir, config.models_dir, config.snapshots_dir):
        Path(path).mkdir(parents=True, exist_ok=True)


def write_secret(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600, atomically (never readable by others, even briefly)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (text + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def bootstrap_admin(config, store) -> str | None:
    """On an empty database: an admin client whose token is written to ``config.admin_token_path``.

    Returns the client id when one was created now, else None. The token is
    never logged nor sent over the network; the log says where the file is.
    """
    from .. import auth

    if store.get_setting(BOOTSTRAP_SETTING):
        return None
    token = auth.new_token()
    path = Path(config.admin_token_path)
    write_secret(path, token)
    client = store.create_client(name="bootstrap-admin", scopes=["admin"], token_hash=auth.hash_token(token))
    store.set_setting(BOOTSTRAP_SETTING, client["id"])
    log.warning(
        "first start: the bootstrap admin token (scope admin) is in %s (mode 0600); "
        "use it to pair clients, then keep it safe or revoke client %s",
        path,
        client["id"],
    )
    return client["id"]


def ensure_models(config, store, registry) -> str | None:
    """Register ``config.model`` (id = file name without ``.gguf``), or the demo model on a registry
    without models. Returns the id of the model registered now, if any."""
    if config.model:
        real = Path(os.path.realpath(os.path.expanduser(str(config.model))))
        model_id = real.name[:-5] if real.name.lower().endswith(".gguf") else real.name
        try:
            row = store.get_model(model_id)
        except NotFound:
            row = None
        if row is not None and Path(registry.file_path(row)).resolve() == real and registry.state(row) == "available":
            return None  # the digest is re-checked at load
        registry.register(str(real), model_id, confined=False)
        return model_id
    if store.list_models():
        return None
    from lmsp.models import demo

    path = Path(config.models_dir) / f"{DEMO_MODEL_ID}.gguf"
    if not path.is_file():
        demo.write_demo_model(path)
        log.info("made the demo model %s (tiny llama, fixed random weights)", path)
    registry.register(path.name, DEMO_MODEL_ID)
    return DEMO_MODEL_ID


def check_service_key(config) -> None:
    """The service's secret (``lmsp.auth.service_secret``) made, or found usable and
    private, at start-up: a fault shows in the log now, not at a client's request
    (which then gets 503; the service runs on)."""
    from .. import auth

    path = Path(config.data_dir) / auth.SECRET_NAME
    try:
        auth.service_secret(config.data_dir)
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
            log.warning("%s was readable by others; it is now 0600", path)
    except OSError as exc:
        log.error("pairing under an Idempotency-Key will answer 503: %s", exc)


def prepare(config, store, *, registry=None) -> dict:
    """Everything a service start needs before serving; returns the start-up recovery report."""
    from .registry import ModelRegistry

    ensure_dirs(config)
    identity = store.identity()
    bootstrap_admin(config, store)
    check_service_key(config)
    registry = registry or ModelRegistry(config, store)
    try:
        ensure_models(config, store, registry)
    except (LMSPError, OSError, ValueError) as exc:
        message = exc.message if isinstance(exc, LMSPError) else str(exc)
        if config.model:  # the operator named it: refuse to start without it
            raise StartupError(f"the model {config.model} cannot be served: {message}") from None
        log.error("the demo model could not be made: %s", message)
    report = store.recover(startup=True, max_attempts=config.max_attempts)
    counts = {key: len(value) for key, value in (report or {}).items() if isinstance(value, list)}
    log.info("service %s: start-up recovery done %s", identity.get("service_id"), counts)
    exhausted = (report or {}).get("exhausted")
    if exhausted:
        log.warning(
            "tasks failed with attempts_exhausted (their worker stopped in each of their %d starts): %s",
            config.max_attempts,
            ", ".join(exhausted),
        )
    return report or {}
