"""Opaque, prefixed, time-sortable ids (ULID-like): ``resp_01J...``."""

from __future__ import annotations

import os
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32
_lock = threading.Lock()
_last_ms = 0
_last_rand = 0


def _b32(value: int, length: int) -> str:
    out = []
    for _ in range(length):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_id(prefix: str, *, now: float | None = None) -> str:
    """A new id ``{prefix}_{26 chars}``: 48 bits of milliseconds, 80 random bits.

    Ids made in the same millisecond by one process are strictly increasing.
    """
    global _last_ms, _last_rand
    ms = int((time.time() if now is None else now) * 1000)
    with _lock:
        if ms <= _last_ms:
            ms = _last_ms
            rand = (_last_rand + 1) & ((1 << 80) - 1)
        else:
            rand = int.from_bytes(os.urandom(10), "big") >> 1  # room to count up
        _last_ms, _last_rand = ms, rand
    return f"{prefix}_{_b32(ms, 10)}{_b32(rand, 16)}"
