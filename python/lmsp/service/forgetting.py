"""``store: false`` responses deleted once delivered, those delivered together in
one write.

A stream's end deletes its response before the stream's last byte (a client that
saw the end finds the response gone). Streams end in bunches: the tasks of a
batch that reach their token limit together. One deletion per stream would be
one ``BEGIN IMMEDIATE`` (and one fsync) each, queued on the store's writer and on
the hub's thread pool ahead of the next requests' task creations, which then
start apart and prefill apart. A :class:`Forgetter` takes the deletions that
wait while one is written and writes them next, in one transaction; each caller
still returns only once its own response is deleted (a group commit).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from lmsp.errors import LMSPError


@dataclass
class _Waiting:
    response_id: str
    client_id: str | None
    done: bool = False
    error: LMSPError | None = None


class Forgetter:
    """Deletes delivered responses for :meth:`~lmsp.service.tasks.TaskService.forget`
    (``store``: the service's, whose ``forget_responses`` deletes many in one write).
    Its locks are greenlets' under gevent (``threading`` patched), threads' otherwise."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._queue_lock = threading.Lock()  # held only to add to or take the queue
        self._write_lock = threading.Lock()  # held by the caller whose write is running
        self._queue: list[_Waiting] = []

    def forget(self, response_id: str, client_id: str | None) -> LMSPError | None:
        """Delete the response (with the others waiting meanwhile); None, or the error
        that left it in place."""
        mine = _Waiting(response_id, client_id)
        with self._queue_lock:
            self._queue.append(mine)
        with self._write_lock:
            if not mine.done:  # not written by the caller before: this one writes the queue
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._write(batch)
        return mine.error

    def _write(self, batch: list[_Waiting]) -> None:
        try:
            errors = self.store.forget_responses([(w.response_id, w.client_id) for w in batch])
        except LMSPError as exc:  # the store refused the write: each is left in place
            errors = [exc] * len(batch)
        except BaseException:  # this caller was stopped: the next one writes the others
            with self._queue_lock:
                self._queue[:0] = batch
            raise
        for waiting, error in zip(batch, errors):
            waiting.error, waiting.done = error, True
