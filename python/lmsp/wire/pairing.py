"""Pairing requests (LMSP B.2) checked: a new code's scopes, name and life
(``POST /v1/pairings``), and a code redeemed for a client (``POST /v1/pair``)."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any, TypeVar

from lmsp import auth
from lmsp.errors import InvalidRequest

from .fields import get_int, get_str, reject_unknown

DEFAULT_PAIRING_SCOPES = ["responses:write", "responses:read", "models:read"]
MAX_NAME = 200

_Name = TypeVar("_Name", str, str | None)


@dataclass(frozen=True)
class PairingAsk:
    """A code asked for: the scopes its client gets, a name, and seconds it lives."""

    scopes: list[str]
    name: str | None
    expires_in: int


@dataclass(frozen=True)
class RedeemAsk:
    """A code given to become a client named ``client_name``."""

    code: str
    client_name: str


def printable(value: _Name, param: str) -> _Name:
    """A name shown in listings and on the operator's terminal (``lmsp clients``):
    no control characters, which could drive that terminal."""
    if value is not None and any(unicodedata.category(ch) == "Cc" for ch in value):
        raise InvalidRequest(f"{param!r} must not contain control characters", param=param)
    return value


def parse_pairing(body: dict[str, Any], ttl: int) -> PairingAsk:
    """``scopes`` (default: those of a client that makes and reads responses), ``name``,
    ``expires_in`` (default ``ttl``, at most a day or ``ttl``)."""
    reject_unknown(body, ("scopes", "name", "expires_in"))
    scopes = body.get("scopes")
    scopes = list(DEFAULT_PAIRING_SCOPES) if scopes is None else auth.validate_scopes(scopes)
    name = printable(get_str(body, "name", max_len=MAX_NAME), "name")
    expires_in = get_int(body, "expires_in", default=ttl, minimum=1, maximum=max(ttl, 86400))
    return PairingAsk(scopes, name, int(expires_in))


def parse_redeem(body: dict[str, Any]) -> RedeemAsk:
    reject_unknown(body, ("code", "client_name"))
    code: str = get_str(body, "code", required=True, max_len=100)
    name = printable(get_str(body, "client_name", required=True, max_len=MAX_NAME), "client_name")
    return RedeemAsk(code, name)
