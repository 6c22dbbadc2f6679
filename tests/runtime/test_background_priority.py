"""Work that must not slow the engine runs at the lowest CPU priority of its own OS
thread: the KV files' thread (runtime/kvdisk.py), and nothing else of the process."""
from __future__ import annotations

import os
import sys
import threading

import pytest

from lmsp.runtime._threads import BACKGROUND_NICE, RealThread, background_priority

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def test_the_calling_thread_alone_gets_the_lowest_priority():
    seen: dict[str, int] = {}

    def work() -> None:
        seen["lowered"] = background_priority()
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    before = os.getpriority(os.PRIO_PROCESS, 0)
    thread = RealThread(work, "background")
    thread.start()
    assert thread.join(10)
    assert seen == {"lowered": True, "nice": BACKGROUND_NICE}
    assert os.getpriority(os.PRIO_PROCESS, 0) == before  # the process and this thread keep theirs
