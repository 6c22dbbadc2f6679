"""The janitor thread: retention, and the checks of the loaded models' files.

Retention (LMSP B.10), in every worker: finished tasks with their events and
responses past ``retention_days``, expired idempotency keys and pairing codes
go, in small transactions (``Store.gc``); unfinished tasks never do. A first
round comes 30 to 90 s after the start, then one every 7.5 to 12.5 minutes (the
workers spread out). Between its rounds the thread checks the files of the
models loaded here: at once when inotify reports a change, and every
``FILE_CHECK_SECONDS`` in any case (the model room unloads a changed one), and
at the first of those checks in a new minute it writes this worker's row of the
service's history (:mod:`.history`).
"""

from __future__ import annotations

import logging
import random
import time
from typing import Callable

from ..errors import LMSPError
from ._threads import Wakeup
from .state import WorkerState

log = logging.getLogger("lmsp.runtime")

JANITOR_FIRST_SECONDS = 60.0  # the janitor's first round after a start (workers spread around it) ...
JANITOR_SECONDS = 600.0  # ... and its rounds after that
FILE_CHECK_SECONDS = 2.0  # the janitor stats the loaded models' files this often (and at once on inotify)


class Janitor:
    """The janitor thread's room (see the module docstring). ``check_model_files()``
    unloads the models loaded here whose files changed (the model room's);
    ``write_history()`` writes the history's row of a minute that ended, if one did."""

    def __init__(
        self,
        state: WorkerState,
        check_model_files: Callable[[], list[str]],
        write_history: Callable[[], bool] = lambda: False,
    ) -> None:
        self.state = state
        self.check_model_files = check_model_files
        self.write_history = write_history
        self.wake = Wakeup()

    def run(self) -> None:
        """The thread's loop: file checks between the retention rounds."""
        state = self.state
        next_round = time.monotonic() + JANITOR_FIRST_SECONDS * (0.5 + random.random())
        while not state.stopping:
            watch = state.registry.watch_fileno()
            wait = min(FILE_CHECK_SECONDS, max(0.0, next_round - time.monotonic()))
            self.wake.wait(wait, [watch] if watch is not None else [])
            if state.stopping:
                break
            try:
                self.check_model_files()
            except Exception:  # a bug must not stop the retention rounds
                log.exception("checking the model files failed")
            self.history()
            if time.monotonic() < next_round:
                continue
            try:
                self.round()
            except Exception as exc:  # a busy store: the next round does it
                log.warning("retention round failed: %s", exc)
            next_round = time.monotonic() + JANITOR_SECONDS * (0.75 + random.random() / 2)

    def history(self) -> None:
        """The history's row of a minute that ended; a busy store: the next check writes it."""
        try:
            self.write_history()
        except LMSPError as exc:
            log.debug("writing the service's history failed: %s", exc)
        except Exception:  # a bug must not stop the janitor
            log.exception("writing the service's history failed")

    def round(self) -> dict[str, int]:
        """One retention round; what it deleted, by kind."""
        counts: dict[str, int] = self.state.store.gc(retention=float(self.state.config.retention_days) * 86400.0)
        if self.state.kvdisk is not None:
            counts.update(self.state.kvdisk.gc())
        if any(counts.values()):
            log.info("retention: deleted %s", ", ".join(f"{n} {what}" for what, n in counts.items() if n))
        return counts
