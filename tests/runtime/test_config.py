"""The service configuration: environment values, checks."""
from __future__ import annotations

import pytest

from lmsp import config as config_mod


def test_the_commit_window_comes_from_the_environment_and_is_checked(tmp_path):
    cfg = config_mod.load(env={"LMSP_COMMIT_WINDOW_MS": "0"}, data_dir=str(tmp_path))
    assert cfg.commit_window_ms == 0.0  # every drain committed at once
    assert config_mod.load(env={}, data_dir=str(tmp_path)).commit_window_ms == 25.0
    for bad in ("-1", "1001"):
        with pytest.raises(ValueError, match="commit_window_ms"):
            config_mod.load(env={"LMSP_COMMIT_WINDOW_MS": bad}, data_dir=str(tmp_path))


def test_batch_invariance_is_on_unless_turned_off(tmp_path):
    assert config_mod.load(env={}, data_dir=str(tmp_path)).batch_invariant is True
    for word, value in (("0", False), ("false", False), ("Off", False), ("1", True), ("yes", True)):
        cfg = config_mod.load(env={"LMSP_BATCH_INVARIANT": word}, data_dir=str(tmp_path))
        assert cfg.batch_invariant is value
    (tmp_path / "lmsp.toml").write_text("batch_invariant = false\n")
    assert config_mod.load(env={}, data_dir=str(tmp_path)).batch_invariant is False
    with pytest.raises(ValueError, match="batch_invariant must be true or false"):
        config_mod.load(env={"LMSP_BATCH_INVARIANT": "sometimes"}, data_dir=str(tmp_path))
    assert config_mod.load(env={"LMSP_PREFIX_CACHE": "off"}, data_dir=str(tmp_path)).prefix_cache is False


def test_the_full_sliding_window_cache_is_off_by_default_and_a_switch(tmp_path):
    assert config_mod.load(env={}, data_dir=str(tmp_path)).kv_swa_full is False
    assert config_mod.load(env={"LMSP_KV_SWA_FULL": "on"}, data_dir=str(tmp_path)).kv_swa_full is True
    with pytest.raises(ValueError, match="kv_swa_full must be true or false"):
        config_mod.load(env={"LMSP_KV_SWA_FULL": "auto"}, data_dir=str(tmp_path))


def test_the_kv_files_budget_defaults_to_a_share_of_the_disk_and_is_checked(tmp_path):
    assert config_mod.load(env={}, data_dir=str(tmp_path)).kv_cache_bytes == -1
    assert config_mod.load(env={"LMSP_KV_CACHE_BYTES": "0"}, data_dir=str(tmp_path)).kv_cache_bytes == 0
    cfg = config_mod.load(env={"LMSP_KV_CACHE_BYTES": "1048576"}, data_dir=str(tmp_path))
    assert (cfg.kv_cache_bytes, cfg.kv_dir) == (1 << 20, tmp_path / "kv")
    for bad in ("-2", "1.5", "lots"):
        with pytest.raises(ValueError, match="kv_cache_bytes"):
            config_mod.load(env={"LMSP_KV_CACHE_BYTES": bad}, data_dir=str(tmp_path))


def test_model_files_are_read_into_memory_unless_mmap_is_set(tmp_path):
    assert config_mod.load(env={}, data_dir=str(tmp_path)).mmap is False
    assert config_mod.load(env={"LMSP_MMAP": "1"}, data_dir=str(tmp_path)).mmap is True
    with pytest.raises(ValueError, match="mmap must be true or false"):
        config_mod.load(env={"LMSP_MMAP": "maybe"}, data_dir=str(tmp_path))


def test_the_log_level_and_the_address_are_checked(tmp_path):
    assert config_mod.load(env={"LMSP_LOG_LEVEL": "WARNING"}, data_dir=str(tmp_path)).log_level == "WARNING"
    with pytest.raises(ValueError, match="log_level must be one of debug, info, warning, error, critical, not 'bogus'"):
        config_mod.load(env={"LMSP_LOG_LEVEL": "bogus"}, data_dir=str(tmp_path))
    for bind in ("127.0.0.1:8080", "[::1]:0", "localhost:65535", "unix:/run/lmsp.sock", "tcp://0.0.0.0:80", "fd://3"):
        assert config_mod.load(env={"LMSP_BIND": bind}, data_dir=str(tmp_path)).bind == bind
    for bind in ("127.0.0.1:99999", "garbage", "127.0.0.1:", "unix:", "::1:8080", "[::1]", "host:-1"):
        with pytest.raises(ValueError, match="bind must be HOST:PORT, \\[IPV6\\]:PORT or unix:PATH"):
            config_mod.load(env={"LMSP_BIND": bind}, data_dir=str(tmp_path))


def test_a_bad_value_names_its_setting_and_where_it_came_from(tmp_path):
    toml = tmp_path / "lmsp.toml"
    for text, message in (('workers = ', f"{toml}: Invalid value (at line 1, column 11)"),
                          ('workers = "two"', f"{toml}: workers must be a whole number, not 'two'"),
                          ('workers = 2.5', f"{toml}: workers must be a whole number, not 2.5"),
                          ('retention_days = "long"', f"{toml}: retention_days must be a number, not 'long'"),
                          ('data_dir = 3', f"{toml}: data_dir must be a path, not 3")):
        toml.write_text(text + "\n")
        with pytest.raises(ValueError) as exc:
            config_mod.load(env={}, data_dir=str(tmp_path))
        assert str(exc.value) == message
    toml.write_text("workers = 2\nretention_days = 1\n")
    cfg = config_mod.load(env={}, data_dir=str(tmp_path))
    assert (cfg.workers, cfg.retention_days) == (2, 1.0)
    with pytest.raises(ValueError) as exc:
        config_mod.load(env={"LMSP_WORKERS": "abc"}, data_dir=str(tmp_path))
    assert str(exc.value) == "LMSP_WORKERS: workers must be a whole number, not 'abc'"
    with pytest.raises(ValueError) as exc:
        config_mod.load(env={"LMSP_CONFIG": str(tmp_path / "nonexistent.toml")}, data_dir=str(tmp_path))
    assert str(exc.value) == f"LMSP_CONFIG: no such file: {tmp_path / 'nonexistent.toml'}"
    other = tmp_path / "other.toml"
    other.write_text("workers = 3\n")
    assert config_mod.load(env={"LMSP_CONFIG": str(other)}, data_dir=str(tmp_path)).workers == 3


def test_the_starts_a_task_may_have_come_from_the_file_or_the_environment(tmp_path):
    assert config_mod.load(env={}, data_dir=str(tmp_path)).max_attempts == 3
    (tmp_path / "lmsp.toml").write_text("max_attempts = 5\n")
    assert config_mod.load(env={}, data_dir=str(tmp_path)).max_attempts == 5
    assert config_mod.load(env={"LMSP_MAX_ATTEMPTS": "1"}, data_dir=str(tmp_path)).max_attempts == 1
    for bad in ("0", "-2"):
        with pytest.raises(ValueError, match="max_attempts must be at least 1"):
            config_mod.load(env={"LMSP_MAX_ATTEMPTS": bad}, data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="LMSP_MAX_ATTEMPTS: max_attempts must be a whole number"):
        config_mod.load(env={"LMSP_MAX_ATTEMPTS": "2.5"}, data_dir=str(tmp_path))
