"""Opaque, prefixed, time-sortable ids (ULID-like): ``resp_01J...``.

A box of a fleet (setting ``box_id``) puts its id between the prefix and the time:
``resp_b1_01J...``. :data:`OWNER` finds it in any id the box made (also in the ids
derived from them, ``msg_b1_01J..._1``); an id made without a box id has none."""

from __future__ import annotations

import os
import re
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32
_lock = threading.Lock()
_last_ms = 0
_last_rand = 0
_box = ""

#: a box id: 1 to 8 lowercase letters and digits
BOX_ID = re.compile(r"[a-z0-9]{1,8}")
#: the owner box of an id (group 1), from the start of the id
OWNER = re.compile(r"^[a-z]+[_-]([a-z0-9]{1,8})_[0-9A-HJKMNP-TV-Z]{26}")


def set_box(box_id: str) -> None:
    """The box id that every id made from now on by this process carries ("" for none)."""
    global _box
    if box_id and not BOX_ID.fullmatch(box_id):
        raise ValueError(f"a box id is 1 to 8 lowercase letters and digits, not {box_id!r}")
    _box = box_id


def box() -> str:
    """This process's box id ("" for none)."""
    return _box


def owner(value: str) -> str | None:
    """The box id in ``value``, or None for an id made without one."""
    found = OWNER.match(value)
    return found.group(1) if found else None


def _b32(value: int, length: int) -> str:
    out = []
    for _ in range(length):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_id(prefix: str, *, now: float | None = None) -> str:
    """A new id ``{prefix}_{26 chars}`` (``{prefix}_{box}_{26 chars}`` on a box of a fleet):
    48 bits of milliseconds, 80 random bits.

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
    box_part = f"{_box}_" if _box else ""
    return f"{prefix}_{box_part}{_b32(ms, 10)}{_b32(rand, 16)}"


def time_part(value: str) -> str:
    """The 26 characters of time and randomness of an id (its order across boxes)."""
    found = OWNER.match(value)
    if found:
        return value[found.end() - 26 : found.end()]
    head, _, rest = value.partition("_") if "_" in value else value.partition("-")
    return rest[:26]
