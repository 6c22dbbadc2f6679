"""The model registry: confinement, digests, metadata, load/unload, failures (B.4)."""
from __future__ import annotations

import hashlib
import os

import pytest
from runtime_helpers import all_events, check_log, submit, wait_finished

from lmsp.errors import InvalidRequest, LMSPError, ModelChanged, ModelInUse, NotFound


def test_register_reads_the_digest_and_the_gguf_metadata(store, make_runtime, model_file):
    rt = make_runtime(store)
    seen = []
    model = rt.register_model("tiny.gguf", progress=lambda done, total: seen.append((done, total)))
    data = model_file.read_bytes()
    assert model["id"] == "tiny"
    assert model["object"] == "model" and model["owned_by"] == "local" and model["format"] == "gguf"
    assert model["digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert model["size_bytes"] == len(data)
    assert model["architecture"] == "llama"
    # what the file says: its tensors' elements, its llama.context_length, its weights' type
    from gguf import GGUFReader
    reader = GGUFReader(model_file)
    assert model["parameters"] == sum(int(t.n_elements) for t in reader.tensors)
    field = reader.fields["llama.context_length"]
    assert model["context_length"] == int(field.parts[field.data[0]][0]) == 4096
    assert model["quantization"] == "F32" == {t.tensor_type.name for t in reader.tensors}.pop()
    assert model["state"] == "available"
    assert "path" not in model
    assert seen and seen[-1] == (len(data), len(data))
    assert [m["id"] for m in rt.list_models()] == ["tiny"]


def test_a_model_says_whether_it_has_a_chat_template(store, make_runtime, config, model_file):
    from lmsp.models.demo import write_demo_model

    write_demo_model(config.models_dir / "base.gguf", chat_template=None)
    rt = make_runtime(store)
    assert rt.register_model("tiny.gguf")["has_chat_template"] is True
    assert rt.register_model("base.gguf")["has_chat_template"] is False
    assert {m["id"]: m["has_chat_template"] for m in rt.list_models()} == {"tiny": True, "base": False}
    assert rt.model_object("base")["has_chat_template"] is False


def test_a_model_registered_before_templates_were_recorded_is_read_from_its_file(store, make_runtime, config,
                                                                                model_file):
    rt = make_runtime(store)
    rt.register_model("tiny.gguf")
    with store._db.write() as conn:  # as migration 5 leaves an older registration
        conn.execute("UPDATE models SET chat_template = NULL")
    assert store.get_model("tiny")["has_chat_template"] is None
    assert rt.model_object("tiny")["has_chat_template"] is True
    assert rt.list_models()[0]["has_chat_template"] is True


def test_register_with_an_explicit_id_in_a_subdirectory(store, make_runtime, config, model_file):
    (config.models_dir / "sub").mkdir()
    os.replace(model_file, config.models_dir / "sub" / "x.gguf")
    rt = make_runtime(store)
    assert rt.register_model("sub/x.gguf", "my-model:v1")["id"] == "my-model:v1"
    assert store.get_model("my-model:v1")["path"] == "sub/x.gguf"


@pytest.mark.parametrize("path", ["/etc/passwd", "../data/lmsp.db", "sub/../../x.gguf", "", "a\x00b"])
def test_paths_outside_the_models_directory_are_refused(store, make_runtime, path):
    rt = make_runtime(store)
    with pytest.raises(InvalidRequest) as err:
        rt.register_model(path)
    assert err.value.param == "path"
    assert err.value.status == 400


def test_a_symlink_leading_out_is_refused(store, make_runtime, config, demo_model_path):
    os.symlink(demo_model_path, config.models_dir / "outside.gguf")
    rt = make_runtime(store)
    with pytest.raises(InvalidRequest, match="outside the models directory"):
        rt.register_model("outside.gguf")


def test_missing_and_non_gguf_files_are_clear_errors(store, make_runtime, config):
    rt = make_runtime(store)
    with pytest.raises(InvalidRequest, match="no such model file"):
        rt.register_model("nothing.gguf")
    (config.models_dir / "notes.gguf").write_text("these are not weights\n" * 10)
    with pytest.raises(InvalidRequest, match="not a usable GGUF model"):
        rt.register_model("notes.gguf")
    (config.models_dir / "dir.gguf").mkdir()
    with pytest.raises(InvalidRequest, match="not a regular file"):
        rt.register_model("dir.gguf")
    assert store.list_models() == []


def test_messages_name_the_path_given_not_the_data_directory(store, make_runtime, config):
    rt = make_runtime(store)
    (config.models_dir / "notes.gguf").write_text("these are not weights\n" * 10)
    with pytest.raises(InvalidRequest) as err:
        rt.register_model("notes.gguf")
    assert str(config.models_dir.resolve()) not in err.value.message


def test_a_file_named_by_the_operator_shows_by_its_name_only(store, make_runtime, demo_model_path, tmp_path):
    """An operator may register a file outside the models directory (``--model``); what
    clients read of it (a task's error, a load's answer) names the file, not where it is."""
    outside = tmp_path / "elsewhere" / "op.gguf"
    outside.parent.mkdir()
    outside.write_bytes(demo_model_path.read_bytes())
    rt = make_runtime(store)
    rt.register_model(str(outside), confined=False)
    outside.unlink()
    with pytest.raises(ModelChanged) as err:
        rt.load_model("op")
    assert "op.gguf" in err.value.message and str(outside.parent) not in err.value.message


@pytest.mark.parametrize("path", ["a" * 300 + ".gguf", "/".join(["d" * 200] * 30)])
def test_paths_the_file_system_refuses_are_bad_requests(store, make_runtime, path):
    rt = make_runtime(store)
    with pytest.raises(InvalidRequest) as err:
        rt.register_model(path)
    assert err.value.param == "path" and err.value.status == 400


@pytest.mark.parametrize("bad_id", ["", "-x", "a b", "x" * 200, "a/b"])
def test_bad_model_ids_are_refused(store, make_runtime, model_file, bad_id):
    rt = make_runtime(store)
    with pytest.raises(InvalidRequest) as err:
        rt.register_model("tiny.gguf", bad_id)
    assert err.value.param == "id"


def test_load_and_unload_show_in_the_state(store, make_runtime, model_file):
    rt = make_runtime(store)
    rt.register_model("tiny.gguf")
    assert rt.load_model("tiny")["state"] == "loaded"
    assert rt.model_object("tiny")["state"] == "loaded"
    tokens = rt.admission.prompt_of("tiny", [{"role": "user", "content": "hi"}])[0]
    assert tokens and tokens[0] == 1  # BOS, then the rendered chat template
    assert rt.unload_model("tiny")["state"] == "available"
    assert rt.admission.prompt_of("tiny", [{"role": "user", "content": "hi"}])[0] is None  # checked at run time
    with pytest.raises(NotFound):
        rt.load_model("nope")


def test_a_prompt_that_cannot_fit_is_refused_before_its_task(store, make_runtime, model_file):
    from lmsp.errors import ContextLengthExceeded

    rt = make_runtime(store)
    rt.register_model("tiny.gguf")
    rt.load_model("tiny")
    with pytest.raises(ContextLengthExceeded) as err:
        rt.admission.prompt_of("tiny", [{"role": "user", "content": "word " * 5000}])[0]
    assert err.value.status == 400
    # what the chat template refuses is refused before a task exists, not failed when it runs
    with pytest.raises(InvalidRequest) as err:
        rt.admission.prompt_of("tiny", [{"role": "user", "content": "a\x00b"}])[0]
    assert err.value.param == "input"


def test_a_changed_file_is_never_served(store, make_runtime, model_file):
    rt = make_runtime(store)
    rt.register_model("tiny.gguf")
    data = bytearray(model_file.read_bytes())
    data[-1] ^= 0xFF  # same size, other content
    model_file.write_bytes(bytes(data))
    with pytest.raises(ModelChanged):
        rt.load_model("tiny")
    assert rt.model_object("tiny")["state"] == "changed"
    task_id = submit(store, rt)
    task = wait_finished(rt, store, task_id)
    assert task["status"] == "failed"
    assert task["error"]["code"] == "model_changed"
    assert check_log(all_events(store, task_id))[-2:] == ["task.loading", "response.failed"]


def test_a_missing_file_shows_missing_and_fails_its_tasks(store, make_runtime, model_file):
    rt = make_runtime(store)
    rt.register_model("tiny.gguf")
    os.unlink(model_file)
    assert rt.model_object("tiny")["state"] == "missing"
    task_id = submit(store, rt)
    task = wait_finished(rt, store, task_id)
    assert task["status"] == "failed"
    assert "missing" in task["error"]["message"]


@pytest.mark.parametrize("error,status,code", [
    (MemoryError("cannot allocate the KV cache"), 503, "unavailable"),
    (ValueError("unknown model architecture: 'xyz'"), 400, "invalid_request"),
])
def test_an_engine_that_fails_to_load_fails_the_task(store, make_runtime, model_file, error, status, code):
    def broken(path, **kwargs):
        raise error

    rt = make_runtime(store, engine_factory=broken)
    rt.register_model("tiny.gguf")
    task_id = submit(store, rt)
    task = wait_finished(rt, store, task_id)
    assert task["status"] == "failed"
    assert task["error"]["code"] == "model_load_failed"
    assert rt.model_object("tiny")["state"] == "failed"
    # a load asked for over HTTP: one of LMSP's codes (503 when memory ran out, which may pass)
    with pytest.raises(LMSPError) as err:
        rt.load_model("tiny")
    assert (err.value.status, err.value.code) == (status, code)
    assert ("Retry-After" in err.value.headers) == (status == 503)


def test_delete_is_refused_while_a_task_needs_the_model(store, make_runtime, model_file):
    rt = make_runtime(store, start=False)  # nothing runs the task: it stays queued
    rt.register_model("tiny.gguf")
    task_id = submit(store, None)
    with pytest.raises(ModelInUse):
        rt.delete_model("tiny")
    store.cancel(task_id)
    rt.delete_model("tiny")
    assert model_file.exists()  # the file is left alone
    with pytest.raises(NotFound):
        rt.model_object("tiny")


def test_the_engine_is_loaded_with_the_batch_invariance_and_swa_full_settings(store, make_runtime, config, model_file):
    from lmsp.native import Engine

    loaded = []

    def engine(path, **kwargs):
        made = Engine(path, **kwargs)
        info = made.info
        loaded.append((kwargs["batch_invariant"], info["batch_invariant"], kwargs["swa_full"], info["swa_full"]))
        return made

    rt = make_runtime(store, engine_factory=engine, config=config.replace(batch_invariant=False, kv_swa_full=True))
    rt.register_model("tiny.gguf")
    task = wait_finished(rt, store, submit(store, rt, max_output_tokens=8))
    assert task["status"] == "completed"
    assert loaded == [(False, False, True, True)]
    check_log(all_events(store, task["id"]))


def test_a_kquant_model_loaded_invariant_says_what_it_costs(store, make_runtime, config, caplog, small_shape):
    from lmsp.models.demo import write_demo_model
    from lmsp.native import quantize

    source = write_demo_model(config.data_dir / "small-f16.gguf", **{**small_shape, "n_layer": 1})
    quantize(source, config.models_dir / "small-q4_k_m.gguf", "q4_k_m")
    rt = make_runtime(store)
    rt.register_model("small-q4_k_m.gguf")
    with caplog.at_level("WARNING", logger="lmsp"):
        task = wait_finished(rt, store, submit(store, rt, model="small-q4_k_m", max_output_tokens=4))
    assert task["status"] == "completed"
    warned = [r.getMessage() for r in caplog.records if "K-quant" in r.getMessage()]
    assert len(warned) == 1 and "LMSP_BATCH_INVARIANT=0" in warned[0]
