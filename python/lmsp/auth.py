"""Tokens, pairing codes and scopes (LMSP B.2).

Tokens and pairing codes are random; the store keeps only their sha256 hex
digests. A bearer token is resolved by the digest of what the client sent and
the stored digest is compared again in constant time.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets

from lmsp.errors import InsufficientScope, InvalidRequest, Unauthorized

SCOPES = ("responses:write", "responses:read", "models:read", "models:write", "admin")
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
    groups = ("".join(secrets.choice(_CODE_ALPHABET) for _ in range(_CODE_GROUP_LEN))
              for _ in range(_CODE_GROUPS))
    return "-".join(groups)


def normalize_code(code: str) -> str:
    """Pairing codes are compared without case, spaces or dashes."""
    return "".join(ch for ch in code.upper() if ch not in " -")


def hash_code(code: str) -> str:
    return hashlib.sha256(normalize_code(code).encode("utf-8")).hexdigest()


def constant_time_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


def expand_scopes(scopes) -> set[str]:
    """The scopes a client effectively holds: ``admin`` implies every scope."""
    held = set(scopes or ())
    if ADMIN in held:
        held.update(SCOPES)
    return held


def validate_scopes(scopes, *, param: str = "scopes") -> list[str]:
    """A scope list from a request: a non-empty list of known scope names."""
    if not isinstance(scopes, list) or not scopes:
        raise InvalidRequest(f"{param} must be a non-empty array of scope names", param=param)
    out: list[str] = []
    for scope in scopes:
        if not isinstance(scope, str) or scope not in SCOPES:
            raise InvalidRequest(f"unknown scope {scope!r}; known scopes: {', '.join(SCOPES)}",
                                 param=param)
        if scope not in out:
            out.append(scope)
    return out


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

