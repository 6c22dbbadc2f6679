"""The KV files in a worker's runtime (demo model): written after a turn, used by
the next one after a restart, refused when damaged, and counted in /metrics."""
from __future__ import annotations

import time

from runtime_helpers import submit, wait_finished

from lmsp import kv
from lmsp.api.metrics import render

PROMPT = "A story about a lighthouse"


def _files(config) -> list[kv.Entry]:
    return kv.entries(config.kv_dir)


def _wait_for_files(config, rt, written: int = 1, timeout: float = 30.0) -> list[kv.Entry]:
    """The KV files once the runtime has written ``written`` of them."""
    deadline = time.monotonic() + timeout
    while rt.metrics()["kv_file_files_written"] < written:
        assert time.monotonic() < deadline, f"no KV file after {timeout} s: {list(config.kv_dir.glob('*'))}"
        time.sleep(0.05)
    return _files(config)


def _turn(store, rt, **request):
    request.setdefault("max_output_tokens", 6)
    task = wait_finished(rt, store, submit(store, rt, PROMPT, **request))
    assert task["status"] == "completed", task
    usage = store.get_response(task["response_id"])["usage"]
    return store.output_text(task["id"]), usage


def _restarted(make_runtime, store, rt, **changes):
    rt.stop(timeout=5.0)
    again = make_runtime(store, config=rt.config.replace(**changes))
    again.register_model("tiny.gguf")
    return again


def _next_prompt(entry: kv.Entry) -> list[int]:
    """A prompt (token ids) that extends what a file holds."""
    held = kv.read_tokens(entry.path)
    assert held is not None and len(held) == entry.n_tokens
    return held + held[1:6]


def test_a_turn_leaves_a_kv_file_that_the_next_prompt_loads_after_a_restart(store, runtime, make_runtime, config):
    _, usage = _turn(store, runtime)
    (entry,) = _wait_for_files(config, runtime)
    assert entry.n_tokens == usage["input_tokens"] + 5  # the prompt and the answer but its last token
    assert runtime.metrics()["kv_file_files_written"] == 1
    assert runtime.metrics()["kv_file_bytes_written"] == entry.size
    prompt = _next_prompt(entry)
    rt = _restarted(make_runtime, store, runtime)
    text, usage = _turn(store, rt, prompt=prompt)
    assert usage["input_tokens_details"]["cached_tokens"] == entry.n_tokens
    figures = rt.metrics()
    assert (figures["kv_file_hits"], figures["kv_file_misses"]) == (1, 0)
    assert figures["kv_file_bytes_read"] == entry.size
    shown = render(task_counts=None, runtime_metrics=figures, http=None, ready=True)
    assert "lmsp_kv_file_hits_total 1\n" in shown and "lmsp_kv_file_misses_total 0\n" in shown
    assert f"lmsp_kv_file_read_bytes_total {entry.size}\n" in shown
    assert "# TYPE lmsp_kv_file_written_bytes_total counter" in shown
    plain = _restarted(make_runtime, store, rt, kv_cache_bytes=0)
    want, usage = _turn(store, plain, prompt=prompt)
    assert usage["input_tokens_details"]["cached_tokens"] == 0
    assert text == want  # greedy: the same as a full prefill


def test_a_damaged_kv_file_is_deleted_and_the_turn_prefilled(store, runtime, make_runtime, config):
    _turn(store, runtime)
    (entry,) = _wait_for_files(config, runtime)
    prompt = _next_prompt(entry)
    rt = _restarted(make_runtime, store, runtime)
    data = bytearray(entry.path.read_bytes())
    data[-10] ^= 0xFF  # one byte of the state
    entry.path.write_bytes(bytes(data))
    text, usage = _turn(store, rt, prompt=prompt)
    assert usage["input_tokens_details"]["cached_tokens"] == 0
    figures = rt.metrics()
    assert (figures["kv_file_hits"], figures["kv_file_refused"], figures["kv_file_misses"]) == (0, 1, 1)
    assert not entry.path.exists()
    plain = _restarted(make_runtime, store, rt, kv_cache_bytes=0)
    assert _turn(store, plain, prompt=prompt)[0] == text


def test_a_graceful_stop_writes_the_files_of_the_turns_that_ended(store, runtime, config):
    _turn(store, runtime)
    runtime.stop(timeout=5.0)
    assert len(_files(config)) == 1


def test_the_next_turn_replaces_the_file_of_the_turn_before(store, runtime, config):
    _turn(store, runtime)
    (first,) = _wait_for_files(config, runtime)
    held = kv.read_tokens(first.path)
    assert held is not None
    # a prompt (token ids) that extends what the first file holds
    task = wait_finished(runtime, store, submit(store, runtime, prompt=held + held[1:6], max_output_tokens=4))
    assert store.get_response(task["response_id"])["usage"]["input_tokens_details"]["cached_tokens"] == len(held)
    # the second file: the new prompt and its answer but the last token; the first is gone
    assert [e.n_tokens for e in _wait_for_files(config, runtime, 2)] == [len(held) + 5 + 3]
    assert not first.path.exists()


def test_kv_cache_bytes_0_writes_no_file(store, make_runtime, config, model_file):
    rt = make_runtime(store, config=config.replace(kv_cache_bytes=0))
    rt.register_model("tiny.gguf")
    _turn(store, rt)
    rt.stop(timeout=5.0)
    assert _files(config) == []
    assert rt.metrics()["kv_cache_budget_bytes"] == 0


def test_turns_read_the_directory_only_in_the_kv_threads_scans(store, runtime, config, monkeypatch):
    # the index keeps the files in memory: many turns, and the lookups and writes read
    # the directory no more often than the rescans (at most one each RESCAN_SECONDS)
    _turn(store, runtime)
    _wait_for_files(config, runtime)
    scans = []
    real = kv.entries
    monkeypatch.setattr(kv, "entries", lambda directory: scans.append(time.monotonic()) or real(directory))
    started = time.monotonic()
    for n in range(6):
        _turn(store, runtime, prompt=f"{PROMPT}, part {n}")
    _wait_for_files(config, runtime, written=7)
    elapsed = time.monotonic() - started
    assert len(scans) <= elapsed / runtime.kvdisk.index.rescan + 2, (len(scans), elapsed)
    assert {e.path.name for e in runtime.kvdisk.index.entries()} == {e.path.name for e in _files(config)}


def test_a_file_another_worker_wrote_is_found_after_a_rescan(store, runtime, config):
    _, usage = _turn(store, runtime)
    (entry,) = _wait_for_files(config, runtime)
    index = runtime.kvdisk.index
    copy = entry.path.with_name(entry.path.name.replace(entry.key, "0" * len(entry.key)))
    copy.write_bytes(entry.path.read_bytes())  # as if another worker had written it
    assert copy.name not in {e.path.name for e in index.entries()} or index.rescan == 0
    deadline = time.monotonic() + 10 * index.rescan
    while copy.name not in {e.path.name for e in index.entries()}:
        assert time.monotonic() < deadline, "the KV thread's rescan never saw the new file"
        time.sleep(0.05)
    copy.unlink()
