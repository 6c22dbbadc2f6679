"""Weights in transparent huge pages (csrc/huge_pages.h): the engine asks for
them where the system has them, reports what the kernel counts, and computes
the same numbers while and after its thread collapses them."""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

from native_helpers import generate, random_prompt

THP = Path("/sys/kernel/mm/transparent_hugepage")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")


def huge_page_size() -> int:
    """The PMD size, 0 where transparent huge pages are off ("never") or absent."""
    try:
        enabled = (THP / "enabled").read_text()
        size = int((THP / "hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 0
    return 0 if "[never]" in enabled else size


def kernel_collapses() -> bool:
    """MADV_COLLAPSE: Linux 6.1 and later."""
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", os.uname().release).groups())
    return (major, minor) >= (6, 1)


def anon_huge_bytes() -> int:
    """This process's anonymous memory in huge pages, as the kernel counts it."""
    text = Path("/proc/self/smaps_rollup").read_text()
    return int(re.search(r"^AnonHugePages:\s+(\d+) kB", text, re.M).group(1)) * 1024


def settled(engine) -> dict:
    """The engine's info once its collapse thread has done every page."""
    deadline = time.monotonic() + 120
    while engine.info["huge_pages_pending"]:
        assert time.monotonic() < deadline, "the weights' pages were still being collapsed after 120 s"
        time.sleep(0.01)
    return engine.info


def test_weights_read_into_memory_are_put_in_huge_pages_where_the_system_has_them(make_engine,
                                                                                 demo_model_path: Path) -> None:
    page = huge_page_size()
    engine = make_engine(n_parallel=1)
    got = settled(engine)["weights_in_huge_pages"]
    if page == 0 or not kernel_collapses():
        # off, or left to khugepaged: the engine collapses nothing
        assert got == 0
        return
    assert got > 0 and got % page == 0
    # the demo model's weights (16.6 MiB) hold at most this many whole pages
    assert got <= (demo_model_path.stat().st_size // page + 1) * page
    # (memory an earlier engine collapsed may be the allocator's to give again)
    assert anon_huge_bytes() >= got


def test_nothing_is_asked_of_a_mapped_file_or_with_huge_pages_off(make_engine) -> None:
    for kwargs in ({"use_mmap": True}, {"huge_pages": False}):
        info = make_engine(n_parallel=1, **kwargs).info
        assert info["weights_in_huge_pages"] == 0 and not info["huge_pages_pending"]


def test_closing_the_engine_stops_its_collapse(make_engine) -> None:
    engine = make_engine(n_parallel=1)
    engine.close()
    assert not engine.info["huge_pages_pending"]


def test_weights_in_huge_pages_give_the_same_tokens_and_log_probabilities(make_engine) -> None:
    prompt = random_prompt(7, 40)
    # the first while its pages are being collapsed, the second once they are, the third on small pages
    engine = make_engine(n_parallel=1)
    runs = [generate(engine, prompt, max_tokens=24, temperature=0.0, logprobs=True)]
    settled(engine)
    runs.append(generate(engine, prompt, max_tokens=24, temperature=0.0, logprobs=True))
    runs.append(generate(make_engine(n_parallel=1, huge_pages=False), prompt, max_tokens=24, temperature=0.0,
                         logprobs=True))
    assert len(runs[0].tokens) > 0
    assert all(run.tokens == runs[0].tokens and run.logprobs == runs[0].logprobs for run in runs)
