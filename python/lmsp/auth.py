"""Tokens, pairing codes and scopes (LMSP B.2).

Tokens and pairing codes are random; the store keeps only their sha256 hex
digests. A bearer token is resolved by the digest of what the client sent and
the stored digest is compared again in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Literal, get_args

from lmsp.errors import InsufficientScope, Unauthorized

#: what a client token may do (B.2)
Scope = Literal["responses:write", "responses:read", "models:read", "models:write", "admin"]
SCOPES: tuple[str, ...] = get_args(Scope)
ADMIN = "admin"

TOKEN_PREFIX = "lmsp_"
_CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I
_CODE_GROUPS, _CODE_GROUP_LEN = 3, 4  # 12 symbols of 5 bits: 60 bits


def new_token() -> str:
    """A new bearer token: 32 random bytes, urlsafe base64, with a short prefix."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_pairing_code() -> str:
    """A one-time pairing code a person can read and type: ``ABCD-EFGH-JKLM``."""
    groups = ("".join(secrets.choice(_CODE_ALPHABET) for _ in range(_CODE_GROUP_LEN)) for _ in range(_CODE_GROUPS))
    return "-".join(groups)


def normalize_code(code: str) -> str:
    """Pairing codes are compared without case, spaces or dashes, and without the box id
    a box of a fleet puts before them (``b.ABCD-EFGH-JKLM``)."""
    return "".join(ch for ch in code.rpartition(".")[2].upper() if ch not in " -")


def boxed_code(code: str, box: str) -> str:
    """A pairing code as a box of a fleet gives it: its box id first, so that the box a
    redemption reaches can send it on to the box that holds the code."""
    return f"{box}.{code}" if box else code


def code_box(code: str) -> str | None:
    """The box id before a pairing code (None: the code names none)."""
    head, dot, _ = code.partition(".")
    return head.strip().lower() if dot else None


def hash_code(code: str) -> str:
    return hashlib.sha256(normalize_code(code).encode("utf-8")).hexdigest()


# -- values derived instead of stored -----------------------------------------------------
# A pairing code or a token made under an Idempotency-Key is derived from the key and a
# secret of the service (HMAC-SHA256), so that a retry is answered with the same value
# (B.8) while the store keeps only its digest, as for every other code and token.

SECRET_NAME = "service.key"
_SECRET_BYTES = 32
_secrets: dict[str, bytes] = {}


def service_secret(data_dir) -> bytes:
    """The service's secret: 32 random bytes in ``DATA_DIR/service.key`` (mode 0600),
    made on first use. Read once per process."""
    path = Path(data_dir) / SECRET_NAME
    known = _secrets.get(str(path))
    if known is not None:
        return known
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = _make_secret(path)
    if len(data) != _SECRET_BYTES:
        raise SecretUnusable(
            f"{path} is not a service key of {_SECRET_BYTES} bytes; remove it and a new one "
            "is made (pairing requests under an Idempotency-Key made before cannot be replayed)"
        )
    _secrets[str(path)] = data
    return data


class SecretUnusable(OSError):
    """``service.key`` is there but not a key (its size)."""


def _make_secret(path: Path) -> bytes:
    """Written whole under a temporary name, then linked into place: of processes making
    it at once, the first link wins and every one reads that."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, secrets.token_bytes(_SECRET_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
        folder = os.open(path.parent, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return path.read_bytes()


def _derive(secret: bytes, purpose: str, scope: str, key: str, nonce: str) -> bytes:
    message = "\0".join((purpose, scope, key, nonce)).encode("utf-8")  # none of them holds NUL
    return hmac.new(secret, message, hashlib.sha256).digest()


def derived_pairing_code(secret: bytes, scope: str, key: str, nonce: str) -> str:
    """The pairing code of a request of ``scope`` (the admin's client id) under
    Idempotency-Key ``key``; ``nonce`` is the request's own (kept with the key), so
    that the key, once expired and used again, makes another code. 60 bits of the
    HMAC, in the form of :func:`new_pairing_code`."""
    n = int.from_bytes(_derive(secret, "lmsp pairing code", scope, key, nonce)[:8], "big")
    symbols = [_CODE_ALPHABET[(n >> (5 * i)) & 31] for i in range(_CODE_GROUPS * _CODE_GROUP_LEN)]
    return "-".join("".join(symbols[i : i + _CODE_GROUP_LEN]) for i in range(0, len(symbols), _CODE_GROUP_LEN))


def derived_token(secret: bytes, scope: str, key: str, nonce: str) -> str:
    """The token of a redemption of ``scope`` under Idempotency-Key ``key`` and with the
    request's ``nonce``: 32 bytes of the HMAC, in the form of :func:`new_token`."""
    digest = _derive(secret, "lmsp client token", scope, key, nonce)
    return TOKEN_PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def constant_time_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


def expand_scopes(scopes) -> set[str]:
    """The scopes a client effectively holds: ``admin`` implies every scope."""
    held = set(scopes or ())
    if ADMIN in held:
        held.update(SCOPES)
    return held


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, or Unauthorized."""
    if not header:
        raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <token>'")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("the Authorization header must be 'Bearer <token>'")
    if len(token) > 512 or not token.isascii() or not token.isprintable():
        raise Unauthorized("invalid bearer token")
    return token


def authenticate(store, header: str | None) -> dict:
    """The client owning the bearer token in ``header``; Unauthorized otherwise."""
    token = bearer_token(header)
    digest = hash_token(token)
    client = store.client_by_token_hash(digest)
    if client is None:
        raise Unauthorized("unknown or revoked token")
    stored = client.get("token_hash")
    if stored is not None and not constant_time_equal(stored, digest):
        raise Unauthorized("unknown or revoked token")
    return client


def require_scope(client: dict, scope: str) -> None:
    if scope not in expand_scopes(client.get("scopes")):
        raise InsufficientScope(f"this request needs the {scope!r} scope")


def is_admin(client: dict) -> bool:
    return ADMIN in set(client.get("scopes") or ())
