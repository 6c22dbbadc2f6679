"""The fleet key and what it signs.

``DATA_DIR/fleet.key`` (mode 0600) holds 32 random bytes as hex, the same on every box
(``lmsp fleet init`` makes it, ``lmsp fleet join`` copies it). A client paired on a box
of a fleet gets a fleet token: its box-local token with the client's id, name and
scopes, signed with the key, so that every box can check it without asking the box
that paired it. A box asks its peers for their revocations with a signed time."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

KEY_NAME = "fleet.key"
FLEET_PREFIX = "lmspf_"
_KEY_BYTES = 32
#: how far a peer's signed time may be from this box's clock
SKEW_SECONDS = 60
_cache: dict[str, bytes | None] = {}


class FleetKeyError(ValueError):
    """A fleet key file that is missing, unreadable or not a key."""


def _decode(text: str, where: str) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        key = b""
    if len(key) != _KEY_BYTES:
        raise FleetKeyError(f"{where} is not a fleet key ({_KEY_BYTES} bytes as hex)")
    return key


def write_key(data_dir: Path, key: bytes) -> Path:
    """``key`` into ``DATA_DIR/fleet.key`` (0600); an existing other key is refused."""
    path = Path(data_dir) / KEY_NAME
    if path.exists():
        if _decode(path.read_text(), str(path)) == key:
            return path
        raise FleetKeyError(f"{path} holds another fleet key; remove it first to change fleets")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{KEY_NAME}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (key.hex() + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def init(data_dir: Path) -> Path:
    """A new fleet key for ``data_dir`` (kept if one is there)."""
    path = Path(data_dir) / KEY_NAME
    if path.exists():
        _decode(path.read_text(), str(path))
        return path
    return write_key(data_dir, secrets.token_bytes(_KEY_BYTES))


def join(data_dir: Path, key_file: Path) -> Path:
    """The fleet key of ``key_file`` (another box's ``fleet.key``) for ``data_dir``."""
    try:
        text = Path(key_file).read_text()
    except OSError as exc:
        raise FleetKeyError(f"{key_file}: {exc.strerror or exc}") from None
    return write_key(data_dir, _decode(text, str(key_file)))


def load(data_dir: Path) -> bytes | None:
    """The fleet key of ``data_dir`` (None: not a box of a fleet); read once per process."""
    path = str(Path(data_dir) / KEY_NAME)
    if path not in _cache:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            _cache[path] = None
        else:
            _cache[path] = _decode(text, path)
    return _cache[path]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(key: bytes, purpose: str, text: str) -> str:
    return _b64(hmac.new(key, f"{purpose}\0{text}".encode("utf-8"), hashlib.sha256).digest())


@dataclass(frozen=True)
class Claims:
    """What a fleet token says: its client, the client's name and scopes, and the
    box-local token whose digest the stores keep."""

    client_id: str
    name: str
    scopes: list[str]
    local: str


def token(key: bytes, client_id: str, name: str, scopes: list[str], local: str) -> str:
    """The fleet token of a client whose box-local token is ``local``."""
    payload = _b64(json.dumps({"c": client_id, "n": name, "s": scopes, "t": local}).encode("utf-8"))
    return f"{FLEET_PREFIX}{payload}.{_sign(key, 'lmsp fleet token', payload)}"


def claims(key: bytes, value: str) -> Claims | None:
    """The claims of a fleet token signed with ``key``; None for anything else."""
    if not value.startswith(FLEET_PREFIX):
        return None
    payload, _, signature = value[len(FLEET_PREFIX) :].partition(".")
    if not hmac.compare_digest(signature.encode("utf-8"), _sign(key, "lmsp fleet token", payload).encode("ascii")):
        return None
    try:
        fields = json.loads(_unb64(payload))
        found = Claims(str(fields["c"]), str(fields["n"]), [str(s) for s in fields["s"]], str(fields["t"]))
    except (ValueError, KeyError, TypeError):
        return None
    return found


def peer_header(key: bytes, now: float | None = None) -> str:
    """The ``Authorization`` a box sends its peers: ``Fleet TIME.SIGNATURE``."""
    stamp = str(int(time.time() if now is None else now))
    return f"Fleet {stamp}.{_sign(key, 'lmsp fleet peer', stamp)}"


def peer_ok(key: bytes, header: str | None, now: float | None = None) -> bool:
    """Whether ``header`` is a peer's :func:`peer_header`, signed within :data:`SKEW_SECONDS`."""
    scheme, _, value = (header or "").partition(" ")
    stamp, _, signature = value.partition(".")
    if scheme != "Fleet" or not stamp.isdigit():
        return False
    if abs(int(stamp) - (time.time() if now is None else now)) > SKEW_SECONDS:
        return False
    return hmac.compare_digest(signature.encode("utf-8"), _sign(key, "lmsp fleet peer", stamp).encode("ascii"))
