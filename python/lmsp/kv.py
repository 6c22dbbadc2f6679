"""KV files: the KV of a prompt's first tokens on disk (``DATA_DIR/kv/``).

The persistent side of the engine's prefix cache. After a turn the worker
writes what its slot kept (``Engine.saved_prefix``) to one file; a later prompt
that starts with the same tokens, for the same model file, engine format and
client, loads it instead of prefilling those tokens (``runtime/kv.py``).

A file's name says what it holds, so that a lookup reads no file it will not
use: ``{model}-{format}-{key}-{n_tokens}-{tokens_hash}[-{owner}].kv``, where ``model``
is the start of the model file's sha256, ``format`` a hash of the engine's
``kv_format`` (backend, batch invariance, the kinds of rows, K and V types),
``key`` a hash of the cache key (the client), ``tokens_hash`` a BLAKE2b of
the tokens and ``owner`` the id of the conversation or chain of responses whose
turn wrote it (none for a task in neither). Its content::

    b"LMSPKV\\x00\\x01"   magic
    u32 (little-endian)  length of the header
    header               JSON: model digest, kv_format, key hash, n_tokens,
                         tiled_rows, tiled_min, state_bytes, state_crc32, owner
    tokens               n_tokens int32, little-endian
    state                llama.cpp's sequence state of those positions

A file is written under a temporary name (``.tmp-*``), synced and renamed, so
no partial file ever has a final name. Only the newest file of a conversation or
chain is kept: writing one deletes the older files of its owner, and those of no
owner (or of a response no other continues) whose tokens the new one's extend.
A file whose owner is gone from the store (a deleted conversation, a chain
deleted or taken by retention, a response in no chain deleted) is deleted by
the next :func:`gc`. The
directory is kept within a byte budget, least recently used first (a file used
is touched).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import struct
import sys
import time
import uuid
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

log = logging.getLogger("lmsp.kv")

MAGIC = b"LMSPKV\x00\x01"
SUFFIX = ".kv"
TMP_PREFIX = ".tmp-"
STALE_TMP_SECONDS = 3600.0  # a temporary file this old was left by a killed writer
AUTO_SHARE = 10  # kv_cache_bytes = -1: a tenth of the data directory's free space ...
AUTO_CAP = 32 << 30  # ... at most 32 GiB
_HEAD = struct.Struct("<I")
_OWNER = re.compile(r"[A-Za-z0-9_]{1,100}")  # an id of the store (``conv_...``, ``resp_...``)


class Refused(Exception):
    """A KV file that fails its check (truncated, damaged, not the expected one)."""


@dataclass(frozen=True)
class Entry:
    """A KV file as its name and ``stat`` describe it."""

    path: Path
    model: str
    fmt: str
    key: str
    n_tokens: int
    tokens_hash: str
    size: int
    mtime: float
    owner: str | None = None  # the conversation's or chain's id


def _tag(text: str, n: int = 16) -> str:
    return hashlib.blake2b(text.encode(), digest_size=n // 2).hexdigest()


def model_tag(digest: str) -> str:
    """The name's part for a model file's digest (``sha256:HEX``)."""
    return digest.rsplit(":", 1)[-1][:16].lower()


def format_tag(kv_format: str) -> str:
    return _tag(kv_format, 8)


def key_tag(cache_key: str) -> str:
    return _tag("key:" + cache_key, 16)


def _token_bytes(tokens: Sequence[int]) -> bytes:
    a = array("i", tokens)
    if sys.byteorder != "little":  # pragma: no cover - the files are little-endian everywhere
        a.byteswap()
    return a.tobytes()


def tokens_hash(tokens: Sequence[int]) -> str:
    return hashlib.blake2b(_token_bytes(tokens), digest_size=16).hexdigest()


def valid_owner(owner: str | None) -> bool:
    """Whether ``owner`` can tag a file (an id of the store's alphabet)."""
    return owner is None or _OWNER.fullmatch(owner) is not None


def file_name(digest: str, kv_format: str, cache_key: str, tokens: Sequence[int], owner: str | None = None) -> str:
    if not valid_owner(owner):
        raise ValueError(f"{owner!r} cannot tag a KV file")
    tag = "" if owner is None else "-" + owner
    return (
        f"{model_tag(digest)}-{format_tag(kv_format)}-{key_tag(cache_key)}-{len(tokens):07d}-{tokens_hash(tokens)}"
        + tag
        + SUFFIX
    )


def _parse(path: Path, st: os.stat_result) -> Entry | None:
    parts = path.name[: -len(SUFFIX)].split("-")
    if len(parts) not in (5, 6) or not parts[3].isdigit():
        return None
    owner = parts[5] if len(parts) == 6 else None
    return Entry(path, parts[0], parts[1], parts[2], int(parts[3]), parts[4], st.st_size, st.st_mtime, owner)


def entry(path: Path) -> Entry | None:
    """The KV file at ``path`` (None: not a KV file's name; OSError: not there)."""
    if not path.name.endswith(SUFFIX) or path.name.startswith("."):
        return None
    return _parse(path, path.stat())


def entries(directory: Path) -> list[Entry]:
    """The KV files of ``directory`` (none when it does not exist)."""
    out = []
    try:
        with os.scandir(directory) as it:
            for d in it:
                if not d.name.endswith(SUFFIX) or d.name.startswith("."):
                    continue
                try:
                    entry = _parse(Path(d.path), d.stat())
                except OSError:  # deleted meanwhile
                    continue
                if entry is not None:
                    out.append(entry)
    except FileNotFoundError:
        pass
    return out


def prefix_hashes(tokens: Sequence[int], lengths: Iterable[int]) -> dict[int, str]:
    """``tokens_hash(tokens[:n])`` for each n of ``lengths`` (one pass over the tokens)."""
    out: dict[int, str] = {}
    h = hashlib.blake2b(digest_size=16)
    done = 0
    for n in sorted(set(lengths)):
        if n > len(tokens):
            break
        h.update(_token_bytes(tokens[done:n]))
        done = n
        out[n] = h.copy().hexdigest()
    return out


def find(
    directory: Path,
    digest: str,
    kv_format: str,
    cache_key: str,
    tokens: Sequence[int],
    found: Iterable[Entry] | None = None,
) -> Entry | None:
    """The longest file of this model, format and key whose tokens start ``tokens``
    (by their hash: :func:`read` checks them one by one), among ``found`` (by default
    the directory's files)."""
    model, fmt, key = model_tag(digest), format_tag(kv_format), key_tag(cache_key)
    mine = [e for e in (entries(directory) if found is None else found) if (e.model, e.fmt, e.key) == (model, fmt, key)]
    hashes = prefix_hashes(tokens, (e.n_tokens for e in mine))
    matching = [e for e in mine if hashes.get(e.n_tokens) == e.tokens_hash]
    return max(matching, key=lambda e: e.n_tokens, default=None)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Offload(Protocol):
    """Where :func:`write` does its bulky work: the state's checksum, its write and sync."""

    def crc32(self, data: bytes | memoryview) -> int: ...

    def write(self, fd: int, data: bytes | memoryview, *, sync: bool) -> None: ...


class InThread:
    """:class:`Offload` on the calling thread (``zlib.crc32`` and ``os.write`` release
    the GIL for a large buffer)."""

    @staticmethod
    def crc32(data: bytes | memoryview) -> int:
        return zlib.crc32(data)

    @staticmethod
    def write(fd: int, data: bytes | memoryview, *, sync: bool) -> None:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)


IN_THREAD = InThread()


def write(
    directory: Path,
    *,
    digest: str,
    kv_format: str,
    cache_key: str,
    tokens: Sequence[int],
    tiled_rows: int,
    tiled_min: int,
    state: bytes | memoryview,
    owner: str | None = None,
    offload: Offload = IN_THREAD,
) -> tuple[Path, int]:
    """Write a KV file (temporary name, synced, renamed, directory synced); its path and
    size. ``owner``: the conversation's or chain's id, in its name and header. The
    state's checksum, write and sync run on ``offload`` (the service's is the native
    low-priority thread): nothing here copies the state."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    header = json.dumps(
        {
            "model": digest,
            "kv_format": kv_format,
            "key": key_tag(cache_key),
            "n_tokens": len(tokens),
            "tiled_rows": int(tiled_rows),
            "tiled_min": int(tiled_min),
            "state_bytes": len(state),
            "state_crc32": offload.crc32(state),
            "owner": owner,
        },
        sort_keys=True,
    ).encode()
    final = directory / file_name(digest, kv_format, cache_key, tokens, owner)
    tmp = directory / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}{SUFFIX}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            offload.write(fd, MAGIC + _HEAD.pack(len(header)) + header + _token_bytes(tokens), sync=False)
            offload.write(fd, state, sync=True)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(directory)
    return final, final.stat().st_size


def read(path: Path, *, digest: str, kv_format: str, cache_key: str, tokens: Sequence[int]) -> dict[str, Any]:
    """A KV file's ``{"tokens", "tiled_rows", "tiled_min", "state"}`` (what
    ``Engine.submit(prefix=...)`` takes; ``state`` a view of the file's bytes, not a
    copy), checked against what the caller expects: the model's digest, the engine's
    format, the key, tokens that start ``tokens``, the file's length and the state's
    checksum. :class:`Refused` otherwise."""
    with open(path, "rb") as fh:
        data = fh.read()
    if len(data) < len(MAGIC) + _HEAD.size or not data.startswith(MAGIC):
        raise Refused("not a KV file")
    (n_head,) = _HEAD.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _HEAD.size
    try:
        head = json.loads(data[start : start + n_head])
        n, n_state = int(head["n_tokens"]), int(head["state_bytes"])
    except (ValueError, KeyError, TypeError):
        raise Refused("its header does not parse") from None
    body = start + n_head
    if len(data) != body + 4 * n + n_state:
        raise Refused(f"{len(data)} bytes where its header says {body + 4 * n + n_state}")
    if head.get("model") != digest or head.get("kv_format") != kv_format or head.get("key") != key_tag(cache_key):
        raise Refused("another model's, engine's or client's")
    held = array("i")
    held.frombytes(data[body : body + 4 * n])
    if sys.byteorder != "little":  # pragma: no cover
        held.byteswap()
    if n == 0 or n > len(tokens) or held.tolist() != list(tokens[:n]):
        raise Refused("its tokens are not the start of the prompt")
    state = memoryview(data)[body + 4 * n :]  # a view: no copy of the state under the GIL
    if zlib.crc32(state) != head.get("state_crc32"):
        raise Refused("its state fails its checksum")
    return {
        "tokens": held.tolist(),
        "tiled_rows": int(head.get("tiled_rows", 0)),
        "tiled_min": int(head.get("tiled_min", 0)),
        "state": state,
    }


def remove(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


def touch(path: Path) -> None:
    """Mark a file used (the budget evicts the least recently used first)."""
    try:
        os.utime(path)
    except OSError:
        pass


def supersede(directory: Path, written: Path, lone: Callable[[set[str]], set[str]] | None = None) -> int:
    """Delete the older files that the written one replaces (:func:`replaced`); how many."""
    found = entries(directory)
    new = next((e for e in found if e.path.name == written.name), None)
    if new is None:
        return 0
    return sum(remove(e.path) for e in replaced(found, new, lone))


def replaced(
    found: Iterable[Entry],
    new: Entry,
    lone: Callable[[set[str]], set[str]] | None = None,
    tokens: Sequence[int] | None = None,
) -> list[Entry]:
    """The older files of the same model, format and key that the written file ``new``
    replaces: every file of its owner (only the newest turn of a conversation or chain
    is kept, whether or not its tokens start the new one's: a template may render an
    answer as other tokens than were generated), and the files whose tokens the written
    file's extend, of no owner or of an owner ``lone(owners)`` names (responses that no
    other continues, whose turn the client sent again as history). Another
    conversation's or chain's file stays. ``tokens``: the written file's, when the
    writer has them (else they are read from it)."""
    mine = [e for e in found if (e.model, e.fmt, e.key) == (new.model, new.fmt, new.key) and e.path != new.path]
    gone = [e for e in mine if new.owner is not None and e.owner == new.owner]
    shorter = [e for e in mine if e.n_tokens < new.n_tokens and e not in gone]
    if shorter and tokens is None:
        tokens = read_tokens(new.path)
    if shorter and tokens is not None:
        hashes = prefix_hashes(tokens, (e.n_tokens for e in shorter))
        held = [e for e in shorter if hashes.get(e.n_tokens) == e.tokens_hash]
        others = {e.owner for e in held if e.owner is not None}
        free = lone(others) if lone is not None and others else set()
        gone += [e for e in held if e.owner is None or e.owner in free]
    return gone


def read_header(path: Path) -> dict[str, Any]:
    """A KV file's header (:class:`Refused` when it has none that parses)."""
    with open(path, "rb") as fh:
        return _header(fh)


def _header(fh) -> dict[str, Any]:
    lead = fh.read(len(MAGIC) + _HEAD.size)
    if len(lead) < len(MAGIC) + _HEAD.size or not lead.startswith(MAGIC):
        raise Refused("not a KV file")
    (n_head,) = _HEAD.unpack_from(lead, len(MAGIC))
    try:
        head = json.loads(fh.read(n_head))
        int(head["n_tokens"])
    except (ValueError, KeyError, TypeError):
        raise Refused("its header does not parse") from None
    return head


def read_tokens(path: Path) -> list[int] | None:
    """The tokens a KV file holds, read without its state (None: unreadable)."""
    try:
        with open(path, "rb") as fh:
            n = int(_header(fh)["n_tokens"])
            held = array("i")
            held.frombytes(fh.read(4 * n))
    except (OSError, ValueError, Refused):
        return None
    if sys.byteorder != "little":  # pragma: no cover
        held.byteswap()
    return held.tolist()


def usage(directory: Path) -> int:
    return sum(e.size for e in entries(directory))


class Holdings:
    """The KV files each model file has in ``directory`` (by its digest), from a scan
    at most ``ttl`` seconds old: a listing of the models reads the directory at most
    once per ``ttl``, and a writer that has just scanned it records that scan
    (:meth:`note`)."""

    def __init__(self, directory: Path, ttl: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self.ttl = ttl
        self._clock = clock
        self._seen: tuple[float, dict[str, tuple[int, int]]] | None = None  # (when, tag -> (files, bytes))

    def note(self, found: Iterable[Entry]) -> int:
        """Record a scan of the directory; the bytes its files hold."""
        by_model: dict[str, tuple[int, int]] = {}
        total = 0
        for e in found:
            n, size = by_model.get(e.model, (0, 0))
            by_model[e.model] = (n + 1, size + e.size)
            total += e.size
        self._seen = (self._clock(), by_model)
        return total

    def note_totals(self, files: Mapping[str, int], sizes: Mapping[str, int]) -> int:
        """Record the files and bytes of each model (by its tag) that an index keeps; the
        bytes in all."""
        self._seen = (self._clock(), {m: (files[m], sizes.get(m, 0)) for m in files if files[m] > 0})
        return sum(sizes.values())

    def of(self, digest: str) -> tuple[int, int]:
        """(files, bytes) kept for the model file of ``digest``."""
        seen = self._seen
        if seen is None or self._clock() - seen[0] > self.ttl:
            try:
                self.note(entries(self.directory))
            except OSError as exc:  # an unreadable directory: nothing to show
                log.warning("KV directory %s could not be read: %s", self.directory, exc)
                self._seen = (self._clock(), {})
            seen = self._seen
        return (seen[1] if seen else {}).get(model_tag(digest), (0, 0))


def enforce_budget(directory: Path, budget: int) -> tuple[int, int]:
    """Delete the least recently used files until the directory holds at most
    ``budget`` bytes of them; (files, bytes) deleted."""
    n = freed = 0
    for e in over_budget(entries(directory), budget):
        if remove(e.path):
            n, freed = n + 1, freed + e.size
    return n, freed


def over_budget(found: Iterable[Entry], budget: int) -> list[Entry]:
    """The least recently used of ``found`` beyond ``budget`` bytes: those to delete."""
    files = sorted(found, key=lambda e: e.mtime)
    total = sum(e.size for e in files)
    out = []
    for e in files:
        if total <= budget:
            break
        out.append(e)
        total -= e.size
    return out


def sweep_temp(directory: Path, older_than: float = STALE_TMP_SECONDS) -> int:
    """Delete temporary files left by writers that died (older than ``older_than`` s)."""
    gone = 0
    try:
        with os.scandir(directory) as it:
            for d in it:
                if d.name.startswith(TMP_PREFIX):
                    try:
                        if time.time() - d.stat().st_mtime > older_than:
                            gone += remove(Path(d.path))
                    except OSError:
                        pass
    except FileNotFoundError:
        pass
    return gone


def drop_orphans(directory: Path, existing: Callable[[set[str]], set[str]]) -> int:
    """Delete the files whose owner is gone: ``existing(owners)`` answers which of the
    owners named by the files the store still holds (asked after the directory is
    read, so that a file written meanwhile is left for the next round); how many."""
    owned = [e for e in entries(directory) if e.owner is not None]
    if not owned:
        return 0
    alive = existing({e.owner for e in owned if e.owner is not None})
    return sum(remove(e.path) for e in owned if e.owner not in alive)


def gc(
    directory: Path,
    budget: int,
    models: set[str] | None = None,
    existing: Callable[[set[str]], set[str]] | None = None,
) -> dict[str, int]:
    """Keep the directory within ``budget``: stale temporary files, the files of
    models not in ``models`` (digests; None keeps every model's), the files whose
    owner is gone (:func:`drop_orphans`, when ``existing`` is given), then the
    least recently used files beyond the budget."""
    counts = {"kv_temporary": sweep_temp(directory), "kv_other_models": 0, "kv_orphans": 0, "kv_over_budget": 0}
    if existing is not None:
        counts["kv_orphans"] = drop_orphans(directory, existing)
    if models is not None:
        tags = {model_tag(d) for d in models}
        counts["kv_other_models"] = sum(remove(e.path) for e in entries(directory) if e.model not in tags)
    counts["kv_over_budget"] = enforce_budget(directory, max(0, budget))[0]
    return counts


def resolve_budget(kv_cache_bytes: int, data_dir: Path) -> int:
    """The byte budget: ``kv_cache_bytes``, or for -1 a tenth of the free space of the
    data directory's file system (what the KV files hold counted as free), at most
    32 GiB."""
    if kv_cache_bytes >= 0:
        return kv_cache_bytes
    try:
        free = shutil.disk_usage(data_dir).free
    except OSError:
        return 0
    return min(AUTO_CAP, (free + usage(data_dir / "kv")) // AUTO_SHARE)
