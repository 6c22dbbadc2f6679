"""The API tests' scripted runtime is the runtime as the API sees it: mypy checks that
it implements lmsp.contracts.RuntimeAPI (api_fakes.py returns one as a RuntimeAPI), as
it checks the service's own runtime (lmsp.app passes a Runtime to create_app)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from api_fakes import ScriptedRuntime

from lmsp.contracts import RuntimeAPI
from lmsp.runtime import Runtime

ROOT = Path(__file__).resolve().parents[2]
FAKES = Path(__file__).with_name("api_fakes.py")

# a runtime the API could not drive: one member of the protocol missing
LACKING = """
from lmsp.contracts import RuntimeAPI
from api_fakes import ScriptedRuntime


class NoCancel(ScriptedRuntime):
    notify_cancel = None  # type: ignore[assignment]


def runtime() -> RuntimeAPI:
    return NoCancel(None)  # type: ignore[arg-type]
"""


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True,
                          check=False, env=dict(os.environ, MYPYPATH=str(FAKES.parent)))


def test_the_scripted_runtime_implements_the_runtime_protocol():
    result = _mypy(str(FAKES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_refuses_a_runtime_that_lacks_a_member(tmp_path):
    lacking = tmp_path / "lacking.py"
    lacking.write_text(LACKING)
    result = _mypy(str(lacking))
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'expected "RuntimeAPI"' in result.stdout and "notify_cancel" in result.stdout


def test_both_runtimes_have_every_member_of_the_protocol(store, config):
    scripted = ScriptedRuntime(store)
    real = Runtime(config, store, prepare=False)
    members = [name for name in dir(RuntimeAPI) if not name.startswith("_")]
    assert {"create_task", "wait_for_commit", "ready", "draining"} <= set(members)
    for runtime in (scripted, real):
        assert all(hasattr(runtime, name) for name in members), type(runtime)
