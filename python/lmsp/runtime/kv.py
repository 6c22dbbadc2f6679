"""The KV files of one worker (:mod:`lmsp.kv`): written after turns, loaded by the next.

While the files are on (``kv_cache_bytes`` not 0, ``prefix_cache`` on), a
sequence is submitted with ``persist`` when the service can continue its turn
(:func:`continuable`: a response in a conversation, or a stored response, which
a ``previous_response_id`` can continue); a ``store: false`` response, a chat
completion or a completion writes no file (each may still load one). When a
persisted sequence ends (``stop`` or ``length``), the commit thread queues it
here; this room's own thread (never the engine thread nor a gevent hub) asks
the engine for what its slot kept (``Engine.saved_prefix``, a copy taken
between two engine steps, into a buffer this thread keeps), writes the file,
deletes the older files of its conversation or chain and keeps the directory
within its budget. A turn tags its file with its owner's id (``Store.kv_owner``:
its conversation, its chain, or the stored response itself, its chain's name to
be); the janitor's round deletes the files whose owner the store no longer
holds.

The room keeps the directory's files in memory (:class:`KvIndex`): a lookup reads
no directory, and a write updates the index with what it wrote and deleted; the
files other workers wrote or deleted show at the KV thread's next scan, at most
``RESCAN_SECONDS`` later. So a request costs the same with ten files or ten
thousand.

At a submission, :meth:`KvDisk.prepare` looks for the longest file of the same
model file, engine format and client whose tokens start the prompt. When it
gives more usable rows than the engine's free slots already hold
(``Engine.cached_prefix``), the file is read, checked and handed to the engine
with the prompt; the engine loads it instead of prefilling those tokens. A file
that fails a check, here or in the engine, is deleted and logged, and the turn
is prefilled.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmsp import kv
from lmsp.runtime._threads import Wakeup, allocate_lock
from lmsp.runtime.state import IDLE_WAIT, WorkerState

log = logging.getLogger("lmsp.runtime")

MAX_TRACKED = 4096  # submitted sequences remembered until their end (older ones are dropped)
RESCAN_SECONDS = 2.0  # the KV thread reads the directory again after this long (other workers' files)
RESPONSE_PREFIX = "resp_"  # the ids of Responses (chat completions: chatcmpl-, completions: cmpl-)


def continuable(request: dict[str, Any], *, kind: str = "", response_id: str = "") -> bool:
    """Whether the service can continue this task's turn, so that its KV file is worth
    writing: a response (``kind`` ``response``, or an id ``resp_...``) in a conversation,
    or stored (a ``previous_response_id`` can continue any stored response)."""
    if kind != "response" and not response_id.startswith(RESPONSE_PREFIX):
        return False
    return bool(request.get("conversation")) or bool(request.get("store", True))


@dataclass
class Ticket:
    """What a submission's lookup found, kept until its sequence ends."""

    model_id: str
    cache_key: str
    task_id: str = ""  # set at the sequence's end (an early start has none before)
    keep: bool = True  # its turn's KV goes to a file at its end (:func:`continuable`)
    path: Any = None  # the file handed to the engine
    prefix: dict[str, Any] | None = None  # ... as Engine.submit(prefix=...) takes it


class LowPriority:
    """:class:`kv.Offload` on the native low-priority thread (csrc/low_priority.h):
    the thread that asks waits without the GIL, so no thread of the lowest priority
    ever holds it."""

    @staticmethod
    def crc32(data: bytes | memoryview) -> int:
        from lmsp.native import crc32_low_priority  # the extension loads in the workers only

        return crc32_low_priority(data)

    @staticmethod
    def write(fd: int, data: bytes | memoryview, *, sync: bool) -> None:
        from lmsp.native import write_low_priority

        write_low_priority(fd, data, sync=sync)


Group = tuple[str, str, str]  # a file's model, format and key: the files one lookup may take


class KvIndex:
    """The KV directory's files as this worker last read it, with this worker's own
    writes and deletions since (see the module docstring). Kept by group and by
    (length, hash of the tokens), so that a lookup or a write costs as many steps as
    its group has lengths of files, not as many as there are files."""

    def __init__(self, directory: Path, rescan: float = RESCAN_SECONDS, clock: Any = time.monotonic) -> None:
        self.directory = directory
        self.rescan = rescan
        self._clock = clock
        self._lock = allocate_lock()
        self._scanned: float | None = None
        self._clear()

    def _clear(self) -> None:
        self._files: dict[str, kv.Entry] = {}
        self._held: dict[Group, dict[tuple[int, str], set[str]]] = {}  # (n_tokens, tokens_hash) -> names
        self._lengths: dict[Group, Counter[int]] = {}
        self._owned: dict[tuple[Group, str], set[str]] = {}
        self.bytes = 0
        self.by_model: Counter[str] = Counter()  # bytes
        self.files_by_model: Counter[str] = Counter()

    def _put(self, e: kv.Entry) -> None:
        name, group = e.path.name, (e.model, e.fmt, e.key)
        if name in self._files:
            self._forget(self._files[name])
        self._files[name] = e
        self._held.setdefault(group, {}).setdefault((e.n_tokens, e.tokens_hash), set()).add(name)
        self._lengths.setdefault(group, Counter())[e.n_tokens] += 1
        if e.owner is not None:
            self._owned.setdefault((group, e.owner), set()).add(name)
        self.bytes += e.size
        self.by_model[e.model] += e.size
        self.files_by_model[e.model] += 1

    def _forget(self, gone: kv.Entry) -> None:
        e = self._files.pop(gone.path.name, None)  # as kept here (a rescan may have read it anew)
        if e is None:
            return
        name, group = e.path.name, (e.model, e.fmt, e.key)
        self._held[group][(e.n_tokens, e.tokens_hash)].discard(name)
        self._lengths[group][e.n_tokens] -= 1
        if self._lengths[group][e.n_tokens] <= 0:
            del self._lengths[group][e.n_tokens]
        if e.owner is not None:
            self._owned[(group, e.owner)].discard(name)
        self.bytes -= e.size
        self.by_model[e.model] -= e.size
        self.files_by_model[e.model] -= 1

    def entries(self) -> list[kv.Entry]:
        """Every file (the directory is read the first time only)."""
        if self._scanned is None:
            self.scan()
        with self._lock:
            return list(self._files.values())

    def prefixes(self, group: Group, tokens: list[int]) -> list[kv.Entry]:
        """The files of ``group`` whose tokens start ``tokens`` (by their hash)."""
        if self._scanned is None:
            self.scan()
        with self._lock:
            lengths, held = list(self._lengths.get(group, ())), self._held.get(group, {})
            hashes = kv.prefix_hashes(tokens, lengths)
            return [self._files[name] for n, h in hashes.items() for name in held.get((n, h), ())]

    def related(self, new: kv.Entry, tokens: list[int]) -> list[kv.Entry]:
        """The files a written file (of ``tokens``) may replace (:func:`kv.replaced`
        chooses): those of its owner, and those whose tokens start its own."""
        group = (new.model, new.fmt, new.key)
        with self._lock:
            owned = [self._files[name] for name in self._owned.get((group, new.owner), ())] if new.owner else []
        return owned + [e for e in self.prefixes(group, tokens) if e not in owned]

    def scan(self) -> None:
        """Read the directory again."""
        found = kv.entries(self.directory)
        with self._lock:
            self._clear()
            for e in found:
                self._put(e)
            self._scanned = self._clock()

    def scan_if_stale(self) -> None:
        if self._scanned is None or self._clock() - self._scanned > self.rescan:
            self.scan()

    def add(self, path: Path) -> kv.Entry | None:
        """A file this worker wrote (None: not there any more)."""
        try:
            found = kv.entry(path)
        except OSError:
            return None
        if found is not None:
            with self._lock:
                self._put(found)
        return found

    def delete(self, gone: list[kv.Entry]) -> int:
        """Delete these files and forget them; how many were deleted here."""
        n = sum(kv.remove(e.path) for e in gone)
        with self._lock:
            for e in gone:
                self._forget(e)
        return n


class KvDisk:
    """This worker's KV files (see the module docstring)."""

    def __init__(self, state: WorkerState) -> None:
        self.state = state
        config = state.config
        data_dir = Path(config.data_dir)  # (a Config made by hand may hold a str)
        self.directory = data_dir / "kv"
        on = bool(config.prefix_cache) and config.kv_cache_bytes != 0
        self.budget = kv.resolve_budget(int(config.kv_cache_bytes), data_dir) if on else 0
        self.enabled = self.budget > 0
        self.wake = Wakeup()
        self._lock = allocate_lock()
        self._jobs: deque[tuple[Any, int, Ticket]] = deque()
        self._tickets: OrderedDict[tuple[int, int], Ticket] = OrderedDict()
        self.counts = dict.fromkeys(
            ("hits", "misses", "refused", "bytes_read", "bytes_written", "files_written", "evicted"), 0
        )
        self.held = 0  # bytes in the directory after this worker's last write or round
        self.index = KvIndex(self.directory)
        # the states' buffer, kept from one write to the next: its pages are touched
        # once, not for each file (the KV thread's alone)
        self._buffer = bytearray()

    # ---------------------------------------------------------------- submissions
    def prepare(
        self,
        engine: Any,
        model_id: str,
        tokens: list[int],
        cache_key: str,
        *,
        look: bool = True,
        keep: bool,
    ) -> Ticket | None:
        """The lookup before ``engine.submit``: None when the files are off, else a
        ticket whose ``prefix`` (maybe None) goes to the engine (see :meth:`submit_kwargs`).
        ``look=False``: no lookup (a resumed task continues from its own snapshot).
        ``keep``: write the file of its turn at its end (:func:`continuable`). Reads a
        file: call it off the gevent hub."""
        if not self.enabled or not tokens:
            return None
        ticket = Ticket(model_id, cache_key, keep=keep)
        if not look:
            return ticket
        digest = self.state.registry.files.loaded_digest(model_id)
        if digest is None:
            return ticket
        kv_format = str(engine.info.get("kv_format") or "")
        try:
            group = (kv.model_tag(digest), kv.format_tag(kv_format), kv.key_tag(cache_key))
            entry = kv.find(
                self.directory, digest, kv_format, cache_key, tokens, found=self.index.prefixes(group, tokens)
            )
        except OSError as exc:
            log.warning("KV file lookup failed: %s", exc)
            return ticket
        if entry is None:
            self._count("misses")
            return ticket
        started = time.perf_counter()
        try:
            # the rows a prefill of this prompt would compute alike (the header only): read it once it pays
            usable = engine.usable_prefix(len(tokens), entry.n_tokens, *self._tiling(entry.path))
            if usable <= engine.cached_prefix(tokens, cache_key):
                return ticket  # a free slot holds as much: nothing to read
            expect = {"digest": digest, "kv_format": kv_format, "cache_key": cache_key}
            ticket.prefix = self._native_state(kv.read(entry.path, tokens=tokens, **expect))
        except kv.Refused as exc:
            self._refuse(entry.path, str(exc))
            return ticket
        except OSError as exc:  # a file deleted meanwhile, a disk error: prefill
            log.warning("KV file %s could not be read: %s", entry.path.name, exc)
            self.index.delete([entry])
            return ticket
        ticket.path = entry.path
        kv.touch(entry.path)
        self._count("bytes_read", entry.size)
        log.debug(
            "KV file %s: %d tokens, read and checked in %.3f s", entry.path.name, usable, time.perf_counter() - started
        )
        return ticket

    @staticmethod
    def _native_state(prefix: dict[str, Any]) -> dict[str, Any]:
        """The prefix with its state copied into the engine's own memory here, without
        the GIL: ``engine.submit`` then takes it over under the runtime's lock with no
        copy, and the file's bytes are freed here, not there."""
        from lmsp.native import KvState  # the extension loads in the workers only

        return {**prefix, "state": KvState(prefix["state"])}

    @staticmethod
    def _tiling(path: Any) -> tuple[int, int]:
        """A file's tiled rows and their chunk length, from its header."""
        head = kv.read_header(path)
        return int(head.get("tiled_rows", 0)), int(head.get("tiled_min", 0))

    @staticmethod
    def submit_kwargs(ticket: Ticket | None) -> dict[str, Any]:
        """What ``engine.submit`` takes from a ticket."""
        if ticket is None:
            return {}
        return {"persist": ticket.keep, "prefix": ticket.prefix}

    def submitted(self, engine: Any, seq: int, ticket: Ticket | None) -> None:
        """The sequence a ticket's submission started."""
        if ticket is None:
            return
        ticket.prefix = None  # the engine has its copy
        with self._lock:
            self._tickets[(id(engine), seq)] = ticket
            while len(self._tickets) > MAX_TRACKED:
                self._tickets.popitem(last=False)

    # ---------------------------------------------------------------- ends (commit thread)
    def finished(self, engine: Any, result: dict[str, Any], task_id: str = "") -> None:
        """A sequence's last result (of task ``task_id``): count what its file did, delete
        a file the engine refused, and queue the save of a turn that ended well."""
        with self._lock:
            ticket = self._tickets.pop((id(engine), int(result.get("seq") or 0)), None)
        if ticket is None:
            return
        ticket.task_id = task_id
        if ticket.path is not None:
            if result.get("prefix_refused"):
                self._refuse(ticket.path, "the engine could not load its state")
            elif result.get("n_loaded"):
                self._count("hits")
                log.debug(
                    "KV file %s used: %s tokens loaded, engine timings %s",
                    ticket.path.name,
                    result.get("n_loaded"),
                    result.get("timings"),
                )
        if ticket.keep and result.get("finish") in ("stop", "length"):
            with self._lock:
                self._jobs.append((engine, int(result["seq"]), ticket))
            self.wake.set()

    def _refuse(self, path: Any, why: str) -> None:
        kv.remove(path)
        self.index.delete([e for e in self.index.entries() if e.path.name == path.name])  # rare: a damaged file
        self._count("refused")
        self._count("misses")
        log.warning("KV file %s refused and deleted: %s", path.name, why)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    # ---------------------------------------------------------------- the thread
    def run(self) -> None:
        """The thread's loop: save the queued sequences' KV; on a graceful stop, those
        still queued too (the engines close after this thread ends). Its bulky work
        (touching the buffer's new pages, a file's checksum, write and sync) runs on
        the native thread of the lowest CPU priority (:class:`LowPriority`), in what
        the engine's threads leave, so a running sequence's steps keep their pace;
        this thread itself keeps the normal priority, as it takes the GIL."""
        while not self.state.stopping:
            self.wake.wait(IDLE_WAIT)
            self.save_queued()
            if self.enabled:
                self.index.scan_if_stale()  # the other workers' files, for the lookups
        if not self.state.aborted:
            self.save_queued()

    def save_queued(self) -> None:
        while not self.state.aborted:
            with self._lock:
                job = self._jobs.popleft() if self._jobs else None
            if job is None:
                return
            try:
                self.save(*job)
            except Exception:  # a full disk, a closed engine: that turn has no file
                log.exception("writing a KV file failed")

    def save(self, engine: Any, seq: int, ticket: Ticket) -> None:
        """One finished sequence's KV into its file (nothing when its slot was reused)."""
        digest = self.state.registry.files.loaded_digest(ticket.model_id)
        if digest is None or engine.closed:
            return
        saved = engine.saved_prefix(seq, into=self._buffer)
        if not saved:
            return
        try:
            self._write(engine, saved, ticket, digest)
        finally:
            saved["state"].release()  # the buffer can grow again

    def _write(self, engine: Any, saved: dict[str, Any], ticket: Ticket, digest: str) -> None:
        if not saved["tokens"] or len(saved["state"]) > self.budget:
            return
        # its owner, read before the file exists: a file named for a deleted owner is orphaned, never kept
        owner = self.state.store.kv_owner(ticket.task_id) if ticket.task_id else None
        if not kv.valid_owner(owner):
            owner = None  # an id no name can hold: the budget governs its file
        path, size = kv.write(
            self.directory,
            digest=digest,
            kv_format=str(engine.info.get("kv_format") or ""),
            cache_key=ticket.cache_key,
            tokens=saved["tokens"],
            tiled_rows=saved["tiled_rows"],
            tiled_min=saved["tiled_min"],
            state=saved["state"],
            owner=owner,
            offload=LowPriority(),
        )
        self.index.scan_if_stale()
        new = self.index.add(path)
        if new is not None:
            tokens = list(saved["tokens"])
            related = self.index.related(new, tokens)
            self.index.delete(kv.replaced(related, new, lone=self.state.store.kv_lone_responses, tokens=tokens))
        evicted = (
            self.index.delete(kv.over_budget(self.index.entries(), self.budget))
            if self.index.bytes > self.budget
            else 0
        )
        with self._lock:
            self.counts["bytes_written"] += size
            self.counts["files_written"] += 1
            self.counts["evicted"] += evicted
        self.held = self.state.registry.kv_files.note_totals(self.index.files_by_model, self.index.by_model)

    # ---------------------------------------------------------------- janitor, metrics
    def gc(self) -> dict[str, int]:
        """The janitor's round: stale temporary files, the files whose owner is gone,
        then the budget."""
        if not self.enabled:
            return {}
        counts = kv.gc(self.directory, self.budget, existing=self.state.store.kv_owners_existing)
        self._count("evicted", counts["kv_over_budget"])
        self.index.scan()
        self.held = self.state.registry.kv_files.note_totals(self.index.files_by_model, self.index.by_model)
        return counts

    def metrics(self) -> dict[str, Any]:
        with self._lock:
            counts = dict(self.counts)
        out: dict[str, Any] = {f"kv_file_{name}": n for name, n in counts.items()}
        out["kv_cache_bytes"] = self.held
        out["kv_cache_budget_bytes"] = self.budget
        return out
