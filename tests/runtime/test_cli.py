"""The operator commands of ``lmsp`` on the store directly (``--json``: one JSON object)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from lmsp import auth
from lmsp.cli import command as cli
from lmsp.runtime import open_store


@pytest.fixture
def run(config, capsys, monkeypatch):
    for name in list(os.environ):
        if name.startswith("LMSP_"):
            monkeypatch.delenv(name)
    open_store(config).close()  # the database the service makes at its first start

    def run(*args, ok=True):
        rc = cli.main([*args, "--data-dir", str(config.data_dir), "--json"])
        out = capsys.readouterr().out
        assert (rc == 0) is ok, (rc, out)
        lines = out.strip().splitlines()
        assert len(lines) == 1, out
        return json.loads(lines[0])

    return run


def test_pair_prints_a_code_that_redeems_once(run, config):
    out = run("pair", "--scopes", "responses:read,models:read", "--name", "laptop")
    assert out["scopes"] == ["responses:read", "models:read"]
    assert out["code"] and out["expires_at"] > 0
    store = open_store(config)
    try:
        client = store.redeem_pairing(code_hash=auth.hash_code(out["code"]), client_name="laptop",
                                      token_hash=auth.hash_token(auth.new_token()))
        assert client["scopes"] == ["responses:read", "models:read"]
    finally:
        store.close()
    listed = run("clients")
    assert [c["id"] for c in listed["data"]] == [client["id"]]
    revoked = run("clients", "revoke", client["id"])
    assert revoked["revoked_at"] is not None


def test_bad_input_is_a_clear_error(run):
    assert run("pair", "--scopes", "everything", ok=False)["error"]["code"] == "command_failed"
    assert run("clients", "revoke", "cli_nope", ok=False)["error"]["code"] == "not_found"
    assert run("tasks", "show", "task_nope", ok=False)["error"]["code"] == "not_found"
    assert run("models", "add", "/no/such/file.gguf", ok=False)["error"]["code"] == "invalid_request"
    for days in ("nan", "inf", "-1"):
        assert run("gc", "--retention-days", days, ok=False)["error"]["code"] == "command_failed"


def finished_task(store, client_id: str, tokens: tuple[int, int]) -> None:
    tid = store.create_task(client_id=client_id, model="m", request={"model": "m", "input": "x"},
                            on_restart="fail", background=True, stream=False)["task"]["id"]
    store.claim("w1", limit=1, lease=30)
    store.set_loading(tid, "w1")
    store.set_running(tid, "w1")
    store.append_step("w1", [{"task_id": tid, "attempt": 1, "delta": "x", "tokens": [1], "finish": "stop",
                              "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]}}])


def test_clients_limit_list_and_usage(run, config, capsys):
    store = open_store(config)
    try:
        a = store.create_client(name="a", scopes=["responses:write"], token_hash="hash-a")["id"]
        b = store.create_client(name="b", scopes=["responses:write"], token_hash="hash-b")["id"]
        finished_task(store, a, (5, 2))
        finished_task(store, a, (3, 1))
        finished_task(store, b, (4, 4))
    finally:
        store.close()
    limited = run("clients", "limit", a, "--priority", "3", "--max-queued", "5", "--tokens-per-hour", "1000")
    assert (limited["id"], limited["priority"], limited["max_queued"], limited["tokens_per_hour"]) == (a, 3, 5, 1000)
    again = run("clients", "limit", a, "--tokens-per-hour", "none", "--max-running", "2")
    assert (again["priority"], again["max_running"], again["max_queued"], again["tokens_per_hour"]) == (3, 2, 5, None)
    listed = {c["id"]: c for c in run("clients", "list")["data"]}
    assert (listed[a]["priority"], listed[a]["max_running"], listed[b]["max_queued"]) == (3, 2, None)
    # its activity: no request yet, the tokens of today's hours
    assert (listed[a]["last_seen_at"], listed[a]["tokens_today"], listed[b]["tokens_today"]) == (None, 11, 8)
    store = open_store(config)
    try:
        assert store.note_seen(a, 60.0) is True
    finally:
        store.close()
    seen = {c["id"]: c for c in run("clients", "list")["data"]}
    assert seen[a]["last_seen_at"] is not None and seen[b]["last_seen_at"] is None
    usage = run("clients", "usage", "--hours", "2")
    assert usage["hours"] == 2
    assert {(r["client_id"], r["client_name"], r["tasks"], r["tokens"]) for r in usage["data"]} == {
        (a, "a", 2, 11), (b, "b", 1, 8)}
    assert cli.main(["clients", "usage", "--data-dir", str(config.data_dir)]) == 0
    text = capsys.readouterr().out
    assert "TOKENS" in text and "11" in text
    assert cli.main(["clients", "--data-dir", str(config.data_dir)]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[3:5] == ["PRIORITY", "LIMITS"]
    assert any(a in row and "max_running=2 max_queued=5" in row for row in rows)


def test_clients_limit_says_what_is_wrong(run, config, capsys):
    store = open_store(config)
    try:
        a = store.create_client(name="a", scopes=["responses:write"], token_hash="hash-a")["id"]
    finally:
        store.close()
    assert run("clients", "limit", "cli_nope", "--priority", "2", ok=False)["error"]["code"] == "not_found"
    assert run("clients", "limit", a, "--priority", "101", ok=False)["error"]["code"] == "invalid_request"
    assert "needs one of" in run("clients", "limit", a, ok=False)["error"]["message"]
    assert "go with clients limit" in run("clients", "list", "--max-queued", "3", ok=False)["error"]["message"]
    with pytest.raises(SystemExit):
        cli.main(["clients", "limit", a, "--max-queued", "lots", "--data-dir", str(config.data_dir)])
    assert "whole number or 'none'" in capsys.readouterr().err


def test_options_may_come_before_the_positionals(run, config, demo_model_path, capsys):
    data = str(config.data_dir)
    added = run("models", "add", "--data-dir", data, str(demo_model_path), "--id", "llama")  # the README's order
    assert added["id"] == "llama"
    store = open_store(config)
    try:
        created = store.create_task(client_id=None, model="m", request={"model": "m", "input": "x"},
                                    on_restart="fail", background=True, stream=False)
        code = auth.new_pairing_code()
        store.create_pairing(code_hash=auth.hash_code(code), scopes=["models:read"], expires_at=2**40, name=None)
        client = store.redeem_pairing(code_hash=auth.hash_code(code), client_name="c",
                                      token_hash=auth.hash_token(auth.new_token()))
    finally:
        store.close()
    assert run("tasks", "show", "--data-dir", data, created["task"]["id"])["id"] == created["task"]["id"]
    assert run("clients", "revoke", "--data-dir", data, client["id"])["revoked_at"] is not None
    with pytest.raises(SystemExit) as exc:  # a wrong command: refused with the command's own usage
        cli.main(["models", "list", "--bogus", "--data-dir", data])
    assert exc.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "usage: lmsp models" in err and "unrecognized arguments: --bogus" in err


def test_commands_refuse_a_data_directory_without_a_database(capsys, tmp_path, monkeypatch):
    """A database made there would take pairing codes that the service never sees."""
    for name in list(os.environ):
        if name.startswith("LMSP_"):
            monkeypatch.delenv(name)
    data = tmp_path / "x" / "y"
    for command in (["pair", "--scopes", "admin"], ["clients"], ["clients", "revoke", "cli_x"], ["models"],
                    ["models", "remove", "m"], ["tasks"], ["tasks", "cancel", "task_x"], ["gc"], ["doctor"]):
        assert cli.main([*command, "--data-dir", str(data), "--json"]) == cli.EXIT_ERROR, command
        message = json.loads(capsys.readouterr().out)["error"]["message"]
        assert message == (f"no database at {data / 'lmsp.db'}; start the service there first "
                           "or run `lmsp prepare`"), command
    assert list(tmp_path.iterdir()) == []


def test_commands_make_files_for_the_service_user_alone(capsys, tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("LMSP_"):
            monkeypatch.delenv(name)
    data = tmp_path / "data"
    before = os.umask(0o022)
    try:
        assert cli.main(["prepare", "--data-dir", str(data), "--json"]) == 0
        shutil.rmtree(data / "snapshots")
        assert cli.main(["pair", "--data-dir", str(data), "--scopes", "admin", "--json"]) == 0
        assert os.umask(0o022) == 0o022  # the caller's mask is left as it was
    finally:
        os.umask(before)
    capsys.readouterr()
    made = [data, data / "lmsp.db", data / "snapshots", *data.glob("lmsp.db-*")]
    assert {str(p): oct(p.stat().st_mode & 0o077) for p in made} == {str(p): "0o0" for p in made}


def test_serve_checks_its_settings_before_anything_is_written(capsys, tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("LMSP_"):
            monkeypatch.delenv(name)

    def execve(*args):
        raise AssertionError("gunicorn was started")

    monkeypatch.setattr(os, "execve", execve)
    data = tmp_path / "data"
    for bind in ("127.0.0.1:99999", "garbage"):
        assert cli.main(["serve", "--data-dir", str(data), "--bind", bind]) == cli.EXIT_ERROR
        assert f"bind must be HOST:PORT, [IPV6]:PORT or unix:PATH (a port from 0 to 65535), not {bind!r}" in (
            capsys.readouterr().err)
    monkeypatch.setenv("LMSP_LOG_LEVEL", "bogus")
    assert cli.main(["serve", "--data-dir", str(data)]) == cli.EXIT_ERROR
    assert "log_level must be one of" in capsys.readouterr().err
    assert not data.exists()


def test_serve_hands_the_starts_a_task_may_have_and_the_rpc_timeout_to_the_service(capsys, tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("LMSP_"):
            monkeypatch.delenv(name)
    started = []

    class Started(Exception):
        pass

    def execve(path, argv, env):
        started.append(env)
        raise Started

    monkeypatch.setattr(os, "execve", execve)
    data = tmp_path / "data"
    assert cli.main(["serve", "--data-dir", str(data), "--max-attempts", "0"]) == cli.EXIT_ERROR
    assert "max_attempts must be at least 1" in capsys.readouterr().err and not started
    with pytest.raises(Started):
        cli.main(["serve", "--data-dir", str(data), "--max-attempts", "2"])
    assert started[-1]["LMSP_MAX_ATTEMPTS"] == "2"  # gunicorn's master, its prepare child and workers read it
    monkeypatch.setenv("LMSP_MAX_ATTEMPTS", "4")
    with pytest.raises(Started):
        cli.main(["serve", "--data-dir", str(data)])
    assert started[-1]["LMSP_MAX_ATTEMPTS"] == "4"
    assert cli.main(["serve", "--data-dir", str(data), "--rpc-timeout", "0"]) == cli.EXIT_ERROR
    assert "rpc_timeout must be more than 0" in capsys.readouterr().err
    with pytest.raises(Started):
        cli.main(["serve", "--data-dir", str(data), "--rpc-timeout", "2.5"])
    assert started[-1]["LMSP_RPC_TIMEOUT"] == "2.5"


def test_help_and_usage_errors_say_what_is_valid(capsys):
    def usage(*argv):
        with pytest.raises(SystemExit) as exc:
            cli.main(list(argv))
        out = capsys.readouterr()
        return exc.value.code, " ".join((out.out + out.err).split())

    code, text = usage("serve", "--help")
    assert code == 0 and "--bind" in text and "--json" not in text  # serve prints no JSON
    code, text = usage("tasks", "--help")
    assert "queued, loading, running, cancelling, completed, failed, cancelled" in text
    assert "1 to 100 (default 20)" in text
    assert "delete finished tasks" in usage("gc", "--help")[1]
    code, text = usage("tasks", "--status", "bogus")
    assert code == cli.EXIT_USAGE and "invalid choice: 'bogus' (choose from 'queued', 'loading'," in text


def test_a_data_directory_or_model_of_the_wrong_kind_is_named(run, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(os, "execve", lambda *args: pytest.fail("gunicorn was started"))
    afile = tmp_path / "afile"
    afile.write_text("")
    for command in ("prepare", "clients", "serve"):
        assert cli.main([command, "--data-dir", str(afile)]) == cli.EXIT_ERROR
        assert capsys.readouterr().err == f"lmsp {command}: the data directory {afile} is not a directory\n"
    assert cli.main(["serve", "--data-dir", str(tmp_path / "data"), "--model", str(tmp_path)]) == cli.EXIT_ERROR
    assert capsys.readouterr().err == f"lmsp serve: --model: {tmp_path} is a directory; name a GGUF file\n"


def test_doctor_reads_a_data_directory_whose_path_needs_escaping(capsys, tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("LMSP_"):
            monkeypatch.delenv(name)
    data = tmp_path / "lm#s?p%41"
    assert cli.main(["prepare", "--data-dir", str(data), "--json"]) == 0
    capsys.readouterr()
    assert cli.main(["doctor", "--data-dir", str(data), "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["database"]["integrity"] == "ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == [data.name]  # no other file was opened as the database


def test_models_add_list_remove_and_doctor(run, config, demo_model_path, tmp_path):
    outside = shutil.copyfile(demo_model_path, tmp_path / "op.gguf")
    added = run("models", "add", str(outside), "--id", "op")
    assert added["id"] == "op" and added["digest"].startswith("sha256:")
    assert [m["id"] for m in run("models")["data"]] == ["op"]
    report = run("doctor")
    assert report["ok"] is True
    assert report["database"]["integrity"] == "ok"
    assert report["models"] == [{"id": "op", "path": str(outside), "status": "ok"}]
    data = bytearray(outside.read_bytes())
    data[100] ^= 1
    outside.write_bytes(bytes(data))
    assert run("doctor", ok=False)["models"][0]["status"] == "changed"
    assert run("models")["data"][0]["state"] == "available"  # same size: only the digest tells
    outside.unlink()
    assert run("doctor", ok=False)["models"][0]["status"] == "missing"
    assert run("models")["data"][0]["state"] == "missing"
    assert run("models", "remove", "op") == {"id": "op", "object": "model", "deleted": True}
    assert run("models")["data"] == []


def test_tasks_list_show_cancel_and_gc(run, config):
    store = open_store(config)
    try:
        created = store.create_task(client_id=None, model="m", request={"model": "m", "input": "x"},
                                    on_restart="fail", background=True, stream=False)
    finally:
        store.close()
    task_id = created["task"]["id"]
    listed = run("tasks", "--status", "queued")
    assert [t["id"] for t in listed["data"]] == [task_id]
    shown = run("tasks", "show", created["response"]["id"])
    assert shown["id"] == task_id and shown["response"]["status"] == "queued"
    assert run("tasks", "cancel", task_id)["status"] == "cancelled"
    assert run("tasks", "cancel", task_id)["status"] == "cancelled"  # idempotent
    assert run("gc", "--retention-days", "0")["deleted"]["tasks"] == 1
    assert run("tasks")["data"] == []


def test_prepare_makes_the_data_directory_ready_and_recovers(run, config):
    out = run("prepare")
    assert out == {"recovered": {"failed": 0, "requeued": 0, "resumed": 0, "cancelled": 0, "exhausted": 0,
                                 "kv_paths": 0}}
    assert (config.data_dir / "admin.token").is_file()
    assert run("models", "list")["data"][0]["id"] == "demo"  # no model named: the demo model
    assert run("prepare") == out  # again: nothing more to do


def test_prepare_refuses_a_data_directory_a_service_holds(run, config):
    """Start-up recovery fails every unfinished task as left over: never under a live service."""
    from lmsp.datadir import hold_data_dir

    lock = hold_data_dir(config.data_dir)  # what a running service's master holds
    try:
        out = run("prepare", ok=False)
        assert "another lmsp service uses the data directory" in out["error"]["message"]
    finally:
        os.close(lock)
    assert "recovered" in run("prepare")


def test_quantize_writes_a_smaller_model(run, config, tmp_path, small_shape):
    from lmsp.models.demo import write_demo_model

    config.models_dir.mkdir(parents=True, exist_ok=True)
    write_demo_model(config.models_dir / "small-f16.gguf", **{**small_shape, "n_layer": 1})
    out = tmp_path / "small-q8_0.gguf"
    done = run("quantize", "small-f16.gguf", str(out), "--type", "q8_0")  # found in models/
    assert done["quantization"] == "Q8_0" and done["path"] == str(out)
    assert done["size_bytes"] == out.stat().st_size < done["source_bytes"]
    assert run("quantize", "small-f16.gguf", str(out), "--type", "q8_0", ok=False)["error"]["message"].endswith(
        "exists (--force replaces it)")
    assert "already quantized" in run("quantize", str(out), str(tmp_path / "again.gguf"), "--type", "q4_0",
                                      ok=False)["error"]["message"]
    assert "unknown quantization type" in run("quantize", "small-f16.gguf", str(tmp_path / "x.gguf"), "--type",
                                              "q9", ok=False)["error"]["message"]
    assert run("quantize", "missing.gguf", str(tmp_path / "x.gguf"), "--type", "q8_0", ok=False)["error"]
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "again.gguf").exists()
    assert run("quantize", "small-f16.gguf", str(tmp_path / "no" / "x.gguf"), "--type", "q8_0", ok=False)[
        "error"]["message"] == f"cannot write {tmp_path / 'no' / 'x.gguf'}: no such directory: {tmp_path / 'no'}"
    assert run("quantize", "small-f16.gguf", str(tmp_path), "--type", "q8_0", "--force", ok=False)["error"][
        "message"] == f"cannot write {tmp_path}: it is a directory (name the file to write)"
    upper = run("quantize", "small-f16.gguf", str(tmp_path / "upper.gguf"), "--type", "Q8_0")  # as `models` shows it
    assert upper["quantization"] == "Q8_0"


def test_dev_serve_help_answers_without_setting_anything_up(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMSP_")}
    env["LMSP_VENV"] = str(tmp_path / "venv")
    done = subprocess.run([str(root / "scripts" / "dev"), "serve", "--help"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: lmsp serve") and "--bind" in done.stdout
    assert not (tmp_path / "venv").exists()


def test_gc_keeps_the_kv_files_within_their_budget(run, config, monkeypatch):
    from lmsp import kv

    def put(tokens, age, digest="sha256:" + "ab" * 32):
        path, _ = kv.write(config.kv_dir, digest=digest, kv_format="f", cache_key="", tokens=tokens,
                                tiled_rows=0, tiled_min=0, state=b"s" * 1000)
        os.utime(path, (path.stat().st_mtime - age,) * 2)
        return path

    old, new = put([1], 100), put([2], 0)
    monkeypatch.setenv("LMSP_KV_CACHE_BYTES", str(new.stat().st_size))
    deleted = run("gc")["deleted"]
    # no model is registered: the files of none are kept, whatever the budget
    assert deleted["kv_other_models"] == 2 and not old.exists() and not new.exists()
    store = open_store(config)
    try:
        store.put_model({"id": "m", "path": "m.gguf", "digest": "sha256:" + "ab" * 32, "size_bytes": 1})
    finally:
        store.close()
    old, new = put([1], 100), put([2], 0)
    assert run("gc")["deleted"]["kv_over_budget"] == 1
    assert new.exists() and not old.exists()


def test_gc_deletes_the_kv_files_of_deleted_conversations(run, config):
    from lmsp import kv

    digest = "sha256:" + "ab" * 32
    store = open_store(config)
    try:
        store.put_model({"id": "m", "path": "m.gguf", "digest": digest, "size_bytes": 1})
        kept, gone = (store.create_conversation(None, {}, [])["id"] for _ in range(2))
        store.delete_conversation(gone)
    finally:
        store.close()
    paths = [
        kv.write(config.kv_dir, digest=digest, kv_format="f", cache_key="", tokens=[i], tiled_rows=0,
                      tiled_min=0, state=b"s", owner=owner)[0]
        for i, owner in enumerate((kept, gone, None))
    ]
    assert run("gc")["deleted"]["kv_orphans"] == 1
    assert [p.exists() for p in paths] == [True, False, True]
