"""A loaded model's file changed on disk: the model is unloaded, shown changed, and
never served changed (LMSP B.4)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from runtime_helpers import submit, wait_finished, wait_until

from lmsp.errors import ModelChanged
from lmsp.runtime import model_files
from lmsp.runtime.filewatch import FileIdentity, FileWatch


def _flip_middle(path) -> None:
    """Change bytes in the middle of the file in place (same size, same inode)."""
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        fh.seek(size // 2)
        data = fh.read(64)
        fh.seek(size // 2)
        fh.write(bytes(b ^ 0xFF for b in data))


def _loaded(store, runtime) -> str:
    """Serve one request (the model loads); the registered digest."""
    task = wait_finished(runtime, store, submit(store, runtime, max_output_tokens=2))
    assert task["status"] == "completed"
    return store.get_model("tiny")["digest"]


def test_a_loaded_model_edited_in_place_shows_changed_and_is_not_served(store, runtime, model_file):
    digest = _loaded(store, runtime)
    _flip_middle(model_file)
    shown = runtime.model_object("tiny")
    assert (shown["state"], shown["digest"]) == ("changed", digest)
    assert runtime.registry.engine("tiny") is None  # unloaded
    task = wait_finished(runtime, store, submit(store, runtime))
    assert task["status"] == "failed" and task["error"]["code"] == "model_changed"
    assert store.get_model("tiny")["digest"] == digest  # the registration stays
    assert runtime.model_object("tiny")["state"] == "changed"


def test_a_row_read_before_the_unload_still_shows_changed(store, runtime, model_file):
    _loaded(store, runtime)
    row = store.get_model("tiny")  # as a listing read it while the model was loaded
    _flip_middle(model_file)
    runtime.check_model_files()  # (unless the watch's thread did it first)
    assert runtime.registry.engine("tiny") is None
    assert runtime.registry.state(row) == "changed"


def test_a_task_is_not_started_on_a_model_whose_file_changed(store, runtime, model_file):
    _loaded(store, runtime)
    _flip_middle(model_file)  # nobody asked for the model since: the start checks the file
    task = wait_finished(runtime, store, submit(store, runtime))
    assert task["status"] == "failed" and task["error"]["code"] == "model_changed"
    assert runtime.registry.engine("tiny") is None


def test_a_task_running_when_its_models_file_changes_fails_with_model_changed(store, runtime, model_file):
    _loaded(store, runtime)
    task_id = submit(store, runtime, max_output_tokens=2000)
    wait_until(runtime, store, task_id, lambda t: t["status"] == "running" and t["last_sequence_number"] > 4)
    _flip_middle(model_file)
    runtime.check_model_files()  # (unless the janitor thread, woken by the watch, was first)
    assert runtime.registry.engine("tiny") is None
    task = wait_finished(runtime, store, task_id)
    assert task["status"] == "failed", task
    assert task["error"]["code"] == "model_changed"


def test_the_janitor_thread_notices_a_changed_file_by_itself(store, runtime, model_file):
    _loaded(store, runtime)
    os.truncate(model_file, 1 << 20)
    for _ in range(600):  # a guard against a hang only: the watch (or the next poll) sees it
        if runtime.registry.engine("tiny") is None:
            break
        runtime.janitor.wake.wait(0.1)
    assert runtime.registry.engine("tiny") is None
    assert store.get_model("tiny")["state"] == "changed"


def test_a_hard_link_or_chmod_of_a_loaded_models_file_changes_nothing(store, runtime, model_file, tmp_path):
    digest = _loaded(store, runtime)
    os.link(model_file, tmp_path / "another-name.gguf")  # moves the file's change time only
    os.chmod(model_file, 0o640)
    assert runtime.model_object("tiny")["state"] == "loaded"
    assert runtime.check_model_files() == []  # hashed: the digest it was loaded with
    assert runtime.registry.engine("tiny") is not None
    assert wait_finished(runtime, store, submit(store, runtime, max_output_tokens=2))["status"] == "completed"
    assert (store.get_model("tiny")["digest"], runtime.model_object("tiny")["state"]) == (digest, "loaded")


def _move_change_time(path) -> None:
    """A chmod that moves the file's change time (the clock it reads may be coarse)."""
    before = FileIdentity.of(path)
    mode = 0o600
    while FileIdentity.of(path) == before:
        mode ^= 0o040
        os.chmod(path, mode)
        time.sleep(0.002)


def test_a_change_time_that_moves_again_while_the_file_is_hashed_changes_nothing(
        store, runtime, model_file, monkeypatch):
    # a link, then a chmod while the check hashes the file after the link: the
    # identity it hashed under is gone when the hash ends, the bytes are the same
    digest = _loaded(store, runtime)
    hashed = []

    def hash_then_chmod(path, progress=None):
        out = real_digest(path, progress)
        if not hashed:
            _move_change_time(model_file)
        hashed.append(path)
        return out

    real_digest = model_files.file_digest
    monkeypatch.setattr(model_files, "file_digest", hash_then_chmod)
    _move_change_time(model_file)
    assert runtime.check_model_files() == []
    assert len(hashed) >= 2  # hashed again under the newer change time
    assert runtime.registry.engine("tiny") is not None
    assert wait_finished(runtime, store, submit(store, runtime, max_output_tokens=2))["status"] == "completed"
    assert (store.get_model("tiny")["digest"], runtime.model_object("tiny")["state"]) == (digest, "loaded")


def test_a_write_that_sets_the_modification_time_back_is_caught_by_the_hash(store, runtime, model_file):
    _loaded(store, runtime)
    before = os.stat(model_file)
    _flip_middle(model_file)
    os.utime(model_file, ns=(before.st_atime_ns, before.st_mtime_ns))
    runtime.check_model_files()  # (unless the janitor thread, woken by the watch, was first)
    assert runtime.registry.engine("tiny") is None
    assert store.get_model("tiny")["state"] == "changed"


def test_a_file_whose_digest_matches_again_is_served_again(store, runtime, model_file):
    _loaded(store, runtime)
    original = model_file.read_bytes()
    _flip_middle(model_file)
    assert runtime.model_object("tiny")["state"] == "changed"
    model_file.write_bytes(original)
    assert runtime.model_object("tiny")["state"] == "changed"  # until a load checks the digest
    assert runtime.load_model("tiny")["state"] == "loaded"
    assert wait_finished(runtime, store, submit(store, runtime, max_output_tokens=2))["status"] == "completed"


def test_a_file_registered_again_before_the_change_is_seen_keeps_its_new_registration(store, make_runtime,
                                                                                       model_file):
    from lmsp.runtime.registry import ModelRegistry

    rt = make_runtime(store, start=False)  # no janitor thread: the check below is the first to look
    rt.register_model("tiny.gguf")
    rt.load_model("tiny")
    _flip_middle(model_file)  # a new file, which the operator registers from another process
    new = ModelRegistry(rt.config, store).register("tiny.gguf")
    assert rt.check_model_files() == ["tiny"]
    assert rt.registry.engine("tiny") is None
    shown = rt.model_object("tiny")
    assert (shown["state"], shown["digest"]) == ("available", new["digest"])
    assert rt.load_model("tiny")["state"] == "loaded"  # the new file, as registered


def test_a_file_changed_while_it_loads_is_not_served(store, make_runtime, model_file):
    from lmsp import native

    def engine(path, **kwargs):
        made = native.Engine(path, **kwargs)
        _flip_middle(model_file)  # after the digest check, before the load ends
        return made

    rt = make_runtime(store, engine_factory=engine)
    rt.register_model("tiny.gguf")
    with pytest.raises(ModelChanged):
        rt.load_model("tiny")
    assert rt.registry.engine("tiny") is None
    assert rt.model_object("tiny")["state"] == "changed"


@pytest.mark.parametrize("mmap", [False, True])
def test_the_model_file_is_read_into_memory_unless_mmap_is_set(store, make_runtime, config, model_file, mmap):
    from lmsp import native

    asked = []

    def engine(path, **kwargs):
        asked.append(kwargs["use_mmap"])
        return native.Engine(path, **kwargs)

    rt = make_runtime(store, engine_factory=engine, config=config.replace(mmap=mmap) if mmap else config)
    rt.register_model("tiny.gguf")
    rt.load_model("tiny")
    assert asked == [mmap]


def test_the_watch_reports_writes_truncations_and_removals(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    watch = FileWatch()
    if watch.fileno() is None:
        pytest.skip("no inotify on this system: model files are polled (the tests above)")
    watch.add("f", path)
    assert not watch.drain()
    for change in (lambda: os.truncate(path, 50), lambda: os.chmod(path, 0o600),
                   lambda: path.write_bytes(b"y" * 50), path.unlink):
        change()
        assert watch.drain()
    watch.close()


def test_the_watch_starts_in_a_real_thread_of_a_gevent_worker():
    """The janitor thread makes the watch in a worker that gevent patched (where
    ``ctypes.util.find_library``'s subprocess fails off the hub)."""
    code = ("from gevent import monkey; monkey.patch_all()\n"
            "from lmsp.runtime._threads import RealThread\n"
            "from lmsp.runtime.filewatch import FileWatch\n"
            "made = []\n"
            "thread = RealThread(lambda: made.append(FileWatch()), 'lmsp-janitor')\n"
            "thread.start(); assert thread.join(30)\n"
            "print(len(made), made[0].fileno() is not None if made else None)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "True"], done.stdout + done.stderr
