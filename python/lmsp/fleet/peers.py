"""What a box asks of the other boxes of its fleet, over HTTP: a create forwarded once to
the box of the id it names, a page of a list, the revocations a box made."""

from __future__ import annotations

import http.client
import json
from typing import Any, Iterator

#: the header a box sets on what it forwards or asks of a peer (the peer answers alone)
FORWARDED = "X-LMSP-Forwarded"
#: the header nginx sets on a list asked through it (the box gathers its peers' pages)
GATHER = "X-LMSP-Gather"
#: request headers a forwarded request keeps
PASSED = ("Authorization", "Content-Type", "Idempotency-Key", "Accept", "X-Request-Id", "Last-Event-ID")
#: answer headers a forwarded answer keeps
KEPT = ("Content-Type", "Location", "Retry-After", "Idempotent-Replayed", "Cache-Control", "WWW-Authenticate")


class PeerDown(OSError):
    """The peer could not be reached, or broke off before its answer's head."""


def _connect(address: str, timeout: float) -> http.client.HTTPConnection:
    host, _, port = address.rpartition(":")
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def send(
    address: str, method: str, target: str, headers: dict[str, str], body: bytes | None, *, timeout: float
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """``method target`` on the peer at ``address``; the connection and the answer, its
    head read (PeerDown: no answer)."""
    conn = _connect(address, timeout)
    try:
        conn.request(method, target, body=body, headers={**headers, FORWARDED: "1"})
        return conn, conn.getresponse()
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise PeerDown(f"{address}: {exc}") from None


def chunks(conn: http.client.HTTPConnection, answer: http.client.HTTPResponse) -> Iterator[bytes]:
    """The answer's body as it arrives (a stream's events one by one); the connection is
    closed at its end or when the client leaves."""
    try:
        while True:
            part = answer.read1(65536)
            if not part:
                return
            yield part
    except (OSError, http.client.HTTPException):
        return
    finally:
        conn.close()


def get_json(address: str, target: str, headers: dict[str, str], *, timeout: float) -> tuple[int, Any]:
    """``GET target`` of the peer: its status and JSON body (PeerDown: none)."""
    conn, answer = send(address, "GET", target, headers, None, timeout=timeout)
    try:
        raw = answer.read()
    except (OSError, http.client.HTTPException) as exc:
        raise PeerDown(f"{address}: {exc}") from None
    finally:
        conn.close()
    try:
        return answer.status, json.loads(raw)
    except ValueError:
        raise PeerDown(f"{address}: the answer is not JSON") from None
