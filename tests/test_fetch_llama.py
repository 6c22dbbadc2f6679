"""third_party/fetch_llama.py runs before the package is built (CMake calls it on a
fresh clone): it must start with the standard library and the package's source
alone, whatever the package's layout."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_fetch_script_starts_without_an_installed_package():
    # -S: no site-packages (no installed lmsp, no editable hook); -I: no PYTHONPATH
    out = subprocess.run(
        [sys.executable, "-S", "-I", str(ROOT / "third_party" / "fetch_llama.py"), "--help"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "pinned llama.cpp source" in out.stdout
