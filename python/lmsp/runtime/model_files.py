"""The file side of the model registry: paths, digests, and the loaded files' identities.

Paths given over the HTTP API are confined to ``config.models_dir`` (no absolute
paths, no ``..``, no symlink leading out); the operator may name any file by
absolute path. A file's digest is reused while the file keeps the identity it
had when it was hashed. Each loaded model's file is kept with its identity as it
was loaded (:mod:`.filewatch`), and a watch tells when one of them may have
changed.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import InvalidRequest
from .filewatch import FileIdentity, FileWatch

CHUNK = 1 << 20
# a digest is reused for a file whose identity is unchanged only if the file was last
# changed this long before the hash began (a write within the same clock tick as the
# hash's stat would not move its times)
SETTLED_NS = 2_000_000_000
# hashes of a loaded model's file whose change time alone keeps moving, before it counts as changed
KEPT_DIGEST_TRIES = 3


def file_digest(path: str | os.PathLike, progress=None) -> tuple[str, int]:
    """``("sha256:<hex>", size)`` of a file, read in 1 MiB chunks.

    ``progress(done_bytes, total_bytes)`` is called after every chunk.
    """
    h = hashlib.sha256()
    done = 0
    with open(path, "rb") as fh:
        total = os.fstat(fh.fileno()).st_size
        while True:
            chunk = fh.read(CHUNK)
            if not chunk:
                break
            h.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    if progress is not None and total == 0:
        progress(0, 0)
    return "sha256:" + h.hexdigest(), done


class ModelFiles:
    """Model file paths, the digest cache, and the files of this process's loaded models.

    ``lock`` is the registry's lock: it guards the loaded files together with the
    registry's engines. The methods marked "lock held" expect the caller to hold it;
    the others take it themselves.
    """

    def __init__(self, config, lock: Any) -> None:
        self.config = config
        self._lock = lock
        self._loaded_files: dict[str, tuple[Path, FileIdentity]] = {}  # model id -> its file as loaded
        self._loaded_digests: dict[str, str] = {}  # model id -> the registered digest it was loaded with
        self._digests: dict[str, tuple[FileIdentity, str]] = {}  # path -> its identity and digest when hashed
        self._watch: FileWatch | None = None  # made on the first load (in the worker, after fork)

    # paths
    def resolve(self, path: str, *, confined: bool = True) -> Path:
        """The real path of a model file; confined to the models directory unless the operator asks."""
        if not isinstance(path, str) or not path.strip() or "\x00" in path:
            raise InvalidRequest("path must be a non-empty file name under the models directory", param="path")
        try:
            return self._resolve(path, confined)
        except (OSError, ValueError) as exc:  # a name too long, a loop of links, ...
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "unusable path"
            raise InvalidRequest(f"cannot use path {path!r}: {reason}", param="path") from None

    def _resolve(self, path: str, confined: bool) -> Path:
        root = Path(self.config.models_dir).resolve()
        if confined:
            pure = PurePosixPath(path)
            if pure.is_absolute() or path.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", path):
                raise InvalidRequest("path must be relative to the models directory, not absolute", param="path")
            if ".." in pure.parts or "\\" in path:
                raise InvalidRequest("path must not contain '..' or backslashes", param="path")
            candidate = root / pure
            real = Path(os.path.realpath(candidate))
            if real != root and root not in real.parents:
                raise InvalidRequest("path leads outside the models directory", param="path")
        else:
            real = Path(os.path.realpath(os.path.expanduser(path)))
        if not real.exists():
            raise InvalidRequest(f"no such model file: {path}", param="path")
        if not real.is_file():
            raise InvalidRequest(f"not a regular file: {path}", param="path")
        return real

    def stored_path(self, real: Path, confined: bool) -> str:
        """The path the store keeps: relative to the models directory when confined."""
        if confined:
            return str(real.relative_to(Path(self.config.models_dir).resolve()))
        return str(real)

    def file_path(self, row: dict) -> Path:
        path = Path(row["path"])
        return path if path.is_absolute() else Path(self.config.models_dir) / path

    # digests
    def digest(self, path: Path, progress=None) -> tuple[str, int]:
        """:func:`file_digest` of a file, hashed again unless the file kept the identity
        it had when this process last hashed it (and had settled by then)."""
        before = FileIdentity.of(path)
        cached = self._digests.get(str(path))
        if before is not None and cached is not None and cached[0] == before:
            if progress is not None:
                progress(before.size, before.size)
            return cached[1], before.size
        started = time.time_ns()
        digest, size = file_digest(path, progress)
        if (
            before is not None
            and size == before.size
            and before.ctime_ns < started - SETTLED_NS
            and FileIdentity.of(path) == before
        ):
            self._digests[str(path)] = (before, digest)
        return digest, size

    # the loaded files
    def loaded(self, model_id: str) -> tuple[Path, FileIdentity] | None:
        """The model's file and its identity as it was loaded (lock held)."""
        return self._loaded_files.get(model_id)

    def track(self, model_id: str, path: Path, identity: FileIdentity, digest: str) -> None:
        """Keep a loaded model's file, its identity and its digest, and watch it (lock held)."""
        self._loaded_files[model_id] = (path, identity)
        self._loaded_digests[model_id] = digest
        if self._watch is None:
            self._watch = FileWatch()
        self._watch.add(model_id, path)

    def forget(self, model_id: str) -> None:
        """Stop keeping and watching an unloaded model's file (lock held)."""
        self._loaded_files.pop(model_id, None)
        self._loaded_digests.pop(model_id, None)
        if self._watch is not None:
            self._watch.remove(model_id)

    def clear(self) -> None:
        """Forget every loaded file and close the watch (lock held)."""
        self._loaded_files.clear()
        self._loaded_digests.clear()
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def loaded_digest(self, model_id: str) -> str | None:
        """The registered digest the model was loaded with here (None: not loaded here)."""
        with self._lock:
            return self._loaded_digests.get(model_id)

    def file_changed(self, model_id: str) -> bool:
        """The model is loaded here and its file is no longer the one it was loaded from
        (written, truncated, replaced or gone since: one ``stat``). A file whose change
        time alone moved is checked by :meth:`changed_files`."""
        with self._lock:
            loaded = self._loaded_files.get(model_id)
        return loaded is not None and not loaded[1].same_bytes_as(FileIdentity.of(loaded[0]))

    def changed_files(self) -> list[str]:
        """The models loaded here whose files changed since they were loaded. A file
        whose change time alone moved (a hard link made to it, a chmod) is hashed: with
        the digest it was loaded with it stays, under its new identity."""
        with self._lock:
            loaded = list(self._loaded_files.items())
        changed = []
        for model_id, (path, identity) in loaded:
            now = FileIdentity.of(path)
            if now == identity:
                continue
            if now is not None and identity.same_bytes_as(now) and self._kept_digest(model_id, path, identity, now):
                continue
            changed.append(model_id)
        return changed

    def _kept_digest(self, model_id: str, path: Path, was: FileIdentity, now: FileIdentity) -> bool:
        """Whether the file still has the digest the model was loaded with; if so, it is
        kept under its identity after the hash. A change time that moved again while
        the file was hashed (a second link or chmod) hashes it again, a few times at most."""
        with self._lock:
            want = self._loaded_digests.get(model_id)
        for _ in range(KEPT_DIGEST_TRIES):
            if want is None or file_digest(path)[0] != want:
                return False
            after = FileIdentity.of(path)
            if after == now:
                break
            if after is None or not was.same_bytes_as(after):
                return False
            now = after  # only its change time moved: hash again
        else:
            return False
        with self._lock:
            if self._loaded_files.get(model_id) == (path, was):
                self._loaded_files[model_id] = (path, now)
        return True

    def watch_fileno(self) -> int | None:
        """A descriptor readable once a loaded model's file may have changed (None: poll
        :meth:`changed_files`). The watch is made in the process that asks first."""
        with self._lock:
            if self._watch is None:
                self._watch = FileWatch()
            return self._watch.fileno()

    def drain_watch(self) -> None:
        with self._lock:
            if self._watch is not None:
                self._watch.drain()
