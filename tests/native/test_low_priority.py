"""The native thread of the lowest CPU priority that does a KV file's bulky work
(csrc/low_priority.h): zlib's checksum, every byte written and synced, errors as
OSError, and the lowest nice value on that thread alone."""
from __future__ import annotations

import os
import random
import sys
import zlib

import pytest

from lmsp import kv
from lmsp.native import crc32_low_priority, low_priority_nice, write_low_priority
from lmsp.runtime.kv import LowPriority


def test_the_checksum_is_zlibs_crc32_for_every_length_and_alignment():
    rng = random.Random(5)
    data = bytes(rng.getrandbits(8) for _ in range(4099))
    for start, end in [(0, 0), (0, 1), (1, 8), (3, 20), (0, 4096), (5, 4099)]:
        view = memoryview(data)[start:end]
        assert crc32_low_priority(view) == zlib.crc32(view)
    assert crc32_low_priority(data[100:], zlib.crc32(data[:100])) == zlib.crc32(data)
    assert crc32_low_priority(bytearray(b"123456789")) == 0xCBF43926  # the CRC-32 check value


def test_the_checksum_holds_across_the_pieces_of_paced_work():
    data = os.urandom((3 << 20) + 7)  # twelve pieces of 256 KiB and a few bytes
    for start in (0, 1, (256 << 10) - 3):
        view = memoryview(data)[start:]
        assert crc32_low_priority(view) == zlib.crc32(view)
    assert crc32_low_priority(data[300_000:], zlib.crc32(data[:300_000])) == zlib.crc32(data)


def test_a_write_puts_every_byte_in_the_file(tmp_path):
    data = os.urandom(3 << 20)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        write_low_priority(fd, b"head", sync=False)
        write_low_priority(fd, memoryview(data), sync=True)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"head" + data


def test_a_failed_write_is_an_oserror_with_its_errno(tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError) as info:
            write_low_priority(fd, b"x")
    finally:
        os.close(fd)
    assert info.value.errno == 9  # EBADF: not open for writing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_the_work_runs_at_the_lowest_priority_and_the_callers_keep_theirs():
    before = os.getpriority(os.PRIO_PROCESS, 0)
    crc32_low_priority(b"x")
    assert low_priority_nice() == 19
    assert os.getpriority(os.PRIO_PROCESS, 0) == before


def test_a_kv_file_written_there_reads_back_as_one_written_in_thread(tmp_path):
    state = os.urandom(1 << 20)
    common = dict(digest="sha256:" + "ab" * 32, kv_format="f", cache_key="k", tokens=[1, 2, 3],
                  tiled_rows=0, tiled_min=0, state=memoryview(state))
    low, _ = kv.write(tmp_path / "low", **common, offload=LowPriority())
    plain, _ = kv.write(tmp_path / "plain", **common)
    assert low.read_bytes() == plain.read_bytes()
    assert low.stat().st_mode & 0o777 == 0o600
    back = kv.read(low, digest=common["digest"], kv_format="f", cache_key="k", tokens=[1, 2, 3, 4])
    assert bytes(back["state"]) == state
