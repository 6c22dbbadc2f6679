"""KV files on their own (lmsp.kv): the format and its checks, chains, the
budget's least-recently-used eviction, gc and the deletion of a chain."""
from __future__ import annotations

import os
import time

import pytest

from lmsp import kv

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
FORMAT = "cpu/invariant/test"
EXPECT = {"digest": DIGEST, "kv_format": FORMAT, "cache_key": "cli_a"}


def put(directory, tokens, *, state=b"\x01\x02" * 50, digest=DIGEST, key="cli_a", age=0.0, owner=None):
    path, size = kv.write(directory, digest=digest, kv_format=FORMAT, cache_key=key, tokens=tokens,
                               tiled_rows=len(tokens), tiled_min=64, state=state, owner=owner)
    if age:
        then = time.time() - age
        os.utime(path, (then, then))
    return path, size


def test_a_written_file_reads_back_for_a_prompt_that_starts_with_its_tokens(tmp_path):
    path, size = put(tmp_path, [1, 2, 3], state=b"state")
    assert size == path.stat().st_size and not list(tmp_path.glob(".tmp-*"))
    found = kv.find(tmp_path, DIGEST, FORMAT, "cli_a", [1, 2, 3, 4, 5])
    assert found is not None and found.path == path and found.n_tokens == 3
    got = kv.read(path, tokens=[1, 2, 3, 4, 5], **EXPECT)
    assert got == {"tokens": [1, 2, 3], "tiled_rows": 3, "tiled_min": 64, "state": b"state"}
    assert kv.read_header(path)["n_tokens"] == 3


def test_the_longest_matching_file_is_found_and_no_other(tmp_path):
    put(tmp_path, [1, 2])
    longest, _ = put(tmp_path, [1, 2, 3, 4])
    put(tmp_path, [1, 2, 9, 9, 9])  # not a start of the prompt
    put(tmp_path, [1, 2, 3, 4, 5, 6], key="cli_b")  # another client's
    put(tmp_path, [1, 2, 3, 4, 5, 6], digest=OTHER)  # another model's
    found = kv.find(tmp_path, DIGEST, FORMAT, "cli_a", [1, 2, 3, 4, 5, 6, 7])
    assert found is not None and found.path == longest
    assert kv.find(tmp_path, DIGEST, "gpu/other", "cli_a", [1, 2, 3, 4, 5]) is None
    assert kv.find(tmp_path, DIGEST, FORMAT, "cli_a", [7, 8, 9]) is None


@pytest.mark.parametrize("damage", ["truncated", "state", "tokens", "magic", "longer"])
def test_a_damaged_file_is_refused(tmp_path, damage):
    path, _ = put(tmp_path, [1, 2, 3], state=b"0123456789")
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[:-3]
    elif damage == "state":
        data[-1] ^= 1
    elif damage == "tokens":
        data[-11] ^= 1  # the last token's high byte
    elif damage == "magic":
        data[0] ^= 1
    else:
        data += b"x"
    path.write_bytes(bytes(data))
    with pytest.raises(kv.Refused):
        kv.read(path, tokens=[1, 2, 3, 4], **EXPECT)


@pytest.mark.parametrize("change", [{"digest": OTHER}, {"kv_format": "cpu/batched"}, {"cache_key": "cli_b"}])
def test_a_file_of_another_model_engine_or_client_is_refused(tmp_path, change):
    path, _ = put(tmp_path, [1, 2, 3])
    with pytest.raises(kv.Refused):
        kv.read(path, tokens=[1, 2, 3, 4], **{**EXPECT, **change})


def test_a_file_longer_than_the_prompt_or_not_its_start_is_refused(tmp_path):
    path, _ = put(tmp_path, [1, 2, 3])
    for prompt in ([1, 2], [1, 2, 4, 5]):
        with pytest.raises(kv.Refused):
            kv.read(path, tokens=prompt, **EXPECT)


def test_a_new_file_replaces_the_older_ones_of_its_chain_only(tmp_path):
    first, _ = put(tmp_path, [1, 2])
    second, _ = put(tmp_path, [1, 2, 3, 4])
    fork, _ = put(tmp_path, [1, 2, 7])
    other_client, _ = put(tmp_path, [1, 2], key="cli_b")
    newest, _ = put(tmp_path, [1, 2, 3, 4, 5, 6])
    assert kv.supersede(tmp_path, newest) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (fork, other_client, newest))
    assert not first.exists() and not second.exists()


def test_the_budget_evicts_the_least_recently_used_first(tmp_path):
    old, size = put(tmp_path, [1], age=300)
    used, _ = put(tmp_path, [2], age=200)
    new, _ = put(tmp_path, [3], age=100)
    kv.touch(used)  # read since: the most recently used
    assert kv.enforce_budget(tmp_path, 2 * size) == (1, size)
    assert not old.exists() and used.exists() and new.exists()
    assert kv.enforce_budget(tmp_path, size) == (1, size)
    assert not new.exists() and used.exists()
    assert kv.enforce_budget(tmp_path, 0) == (1, size)
    assert kv.usage(tmp_path) == 0


def test_gc_removes_stale_temporary_files_unregistered_models_and_what_is_over_budget(tmp_path):
    stale = tmp_path / ".tmp-1-dead.kv"
    stale.write_bytes(b"half")
    then = time.time() - 2 * kv.STALE_TMP_SECONDS
    os.utime(stale, (then, then))
    fresh = tmp_path / ".tmp-2-writing.kv"
    fresh.write_bytes(b"being written")
    put(tmp_path, [1], digest=OTHER)
    _, size = put(tmp_path, [2], age=100)
    kept, _ = put(tmp_path, [3])
    counts = kv.gc(tmp_path, size, models={DIGEST})
    assert counts == {"kv_temporary": 1, "kv_other_models": 1, "kv_orphans": 0, "kv_over_budget": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fresh.name, kept.name])


def test_an_owned_file_is_found_as_any_other_and_names_its_owner(tmp_path):
    path, _ = put(tmp_path, [1, 2, 3], owner="conv_01ABC")
    (entry,) = kv.entries(tmp_path)
    assert entry.owner == "conv_01ABC" and path.name.endswith("-conv_01ABC.kv")
    assert kv.read_header(path)["owner"] == "conv_01ABC"
    assert kv.find(tmp_path, DIGEST, FORMAT, "cli_a", [1, 2, 3, 4]) == entry
    assert kv.read(path, tokens=[1, 2, 3, 4], **EXPECT)["tokens"] == [1, 2, 3]
    with pytest.raises(ValueError):
        put(tmp_path, [1], owner="conv-1/..")


def test_a_turn_supersedes_the_files_of_its_own_owner_or_none_only(tmp_path):
    unowned, _ = put(tmp_path, [1, 2])
    theirs, _ = put(tmp_path, [1, 2, 3], owner="conv_B")
    mine, _ = put(tmp_path, [1, 2, 3, 4], owner="conv_A")
    newest, _ = put(tmp_path, [1, 2, 3, 4, 5, 6], owner="conv_A")
    assert kv.supersede(tmp_path, newest) == 2
    assert not unowned.exists() and not mine.exists() and theirs.exists() and newest.exists()


def test_a_turn_supersedes_every_older_file_of_its_owner_whatever_its_tokens(tmp_path):
    # a template may render an earlier answer as other tokens than were generated
    rendered_apart, _ = put(tmp_path, [1, 2, 9], owner="resp_A")
    longer, _ = put(tmp_path, [1, 2, 3, 4, 5, 6, 7, 8], owner="resp_A")
    other_chain, _ = put(tmp_path, [1, 2, 9], owner="resp_B")
    newest, _ = put(tmp_path, [1, 2, 3, 4, 5, 6], owner="resp_A")
    assert kv.supersede(tmp_path, newest) == 2
    assert not rendered_apart.exists() and not longer.exists() and other_chain.exists() and newest.exists()


def test_a_turn_supersedes_the_files_of_responses_it_repeats_that_no_other_continues(tmp_path):
    lone, _ = put(tmp_path, [1, 2], owner="resp_lone")
    chained, _ = put(tmp_path, [1, 2, 3], owner="resp_chain")
    apart, _ = put(tmp_path, [1, 9], owner="resp_apart")  # its tokens do not start the new file's
    conv, _ = put(tmp_path, [1, 2, 3, 4], owner="conv_A")
    newest, _ = put(tmp_path, [1, 2, 3, 4, 5], owner="resp_new")
    asked = []

    def lone_ones(owners):
        asked.append(owners)
        return owners - {"resp_chain", "conv_A"}

    assert kv.supersede(tmp_path, newest, lone=lone_ones) == 1
    assert asked == [{"resp_lone", "resp_chain", "conv_A"}]
    assert not lone.exists() and chained.exists() and apart.exists() and conv.exists()


def test_gc_deletes_the_files_whose_owner_is_gone(tmp_path):
    gone, _ = put(tmp_path, [1], owner="conv_gone")
    kept, _ = put(tmp_path, [2], owner="conv_kept")
    chain_gone, _ = put(tmp_path, [3], owner="resp_gone")
    unowned, _ = put(tmp_path, [4])
    asked = []

    def existing(owners):
        asked.append(owners)
        return {"conv_kept"}

    counts = kv.gc(tmp_path, 1 << 30, existing=existing)
    assert counts["kv_orphans"] == 2 and asked == [{"conv_gone", "conv_kept", "resp_gone"}]
    assert kept.exists() and unowned.exists() and not gone.exists() and not chain_gone.exists()


def test_the_default_budget_is_a_share_of_the_free_space(tmp_path):
    assert kv.resolve_budget(0, tmp_path) == 0
    assert kv.resolve_budget(12345, tmp_path) == 12345
    def free() -> int:
        st = os.statvfs(tmp_path)
        return st.f_bavail * st.f_frsize

    before = free()  # other processes write to the same disk meanwhile
    auto = kv.resolve_budget(-1, tmp_path)
    most = max(before, free())
    assert 0 < auto <= min(kv.AUTO_CAP, most // kv.AUTO_SHARE + 1)
