"""Pairing requests (LMSP B.2) checked: a new code's scopes, name and life
(``POST /v1/pairings``), and a code redeemed for a client (``POST /v1/pair``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from msgspec import Meta

from lmsp.auth import Scope
from lmsp.errors import InvalidRequest

from .structs import JSON, NO_CONTROL, Body, read

DEFAULT_PAIRING_SCOPES = ["responses:write", "responses:read", "models:read"]
MAX_NAME = 200
MAX_LIFE = 86400  # seconds a code may live, unless pairing_ttl_seconds is longer

#: a name shown in listings and on the operator's terminal: no control characters
ClientName = Annotated[str, Meta(min_length=1, max_length=MAX_NAME, pattern=NO_CONTROL)]


class PairingRequest(Body):
    """A pairing code asked for: the scopes its client gets (by default those of a
    client that makes and reads responses), a name, and the seconds it lives."""

    scopes: Annotated[list[Scope], Meta(min_length=1)] | None = None
    name: ClientName | None = None
    expires_in: Annotated[int, Meta(ge=1)] | None = None

    __schema__: ClassVar[JSON] = {
        "properties": {
            "expires_in": {
                "anyOf": [
                    {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_LIFE,
                        "description": f"At most {MAX_LIFE}, or `pairing_ttl_seconds` when that is larger.",
                    },
                    {"type": "null"},
                ]
            }
        }
    }


class PairRequest(Body):
    """A pairing code redeemed by a new client, which names itself."""

    code: Annotated[str, Meta(min_length=1, max_length=100)]
    client_name: ClientName


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


def parse_pairing(body: dict[str, Any], ttl: int) -> PairingAsk:
    """``expires_in``: default ``ttl``, at most a day or ``ttl``."""
    asked = read(body, PairingRequest)
    scopes: list[str] = list(DEFAULT_PAIRING_SCOPES if asked.scopes is None else dict.fromkeys(asked.scopes))
    expires_in = ttl if asked.expires_in is None else asked.expires_in
    if expires_in > max(ttl, MAX_LIFE):
        raise InvalidRequest(f"'expires_in' must be at most {max(ttl, MAX_LIFE)}", param="expires_in")
    return PairingAsk(scopes, asked.name, expires_in)


def parse_redeem(body: dict[str, Any]) -> RedeemAsk:
    asked = read(body, PairRequest)
    return RedeemAsk(asked.code, asked.client_name)
