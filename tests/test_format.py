"""The project's own C++ (csrc/) is formatted as ``.clang-format`` says.

llama.cpp's sources under third_party/ are not ours and are not checked. The
style is checked with clang-format 14, the version Debian 12 ships;
``scripts/dev test`` installs it. Apply it with
``clang-format -i csrc/*.cpp csrc/*.h``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOW_TO_INSTALL = (
    "clang-format is missing: install it (apt-get install clang-format, which scripts/dev test does when it can)"
)


def _clang_format() -> str:
    exe = shutil.which("clang-format")
    if exe is None:
        pytest.fail(HOW_TO_INSTALL)
    return exe


def _version(exe: str) -> str:
    return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()


def test_csrc_is_formatted() -> None:
    exe = _clang_format()
    assert (ROOT / ".clang-format").is_file()
    files = sorted(str(p.relative_to(ROOT)) for pattern in ("*.cpp", "*.h") for p in (ROOT / "csrc").glob(pattern))
    assert files
    run = subprocess.run(
        [exe, "--style=file", "--dry-run", "--Werror", *files], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, (
        f"csrc/ is not formatted as .clang-format says ({_version(exe)}); "
        f"apply it with: clang-format -i csrc/*.cpp csrc/*.h\n{run.stderr[-6000:]}"
    )


def test_the_check_sees_a_file_out_of_style() -> None:
    exe = _clang_format()
    run = subprocess.run(
        [exe, "--style=file", "--dry-run", "--Werror", "--assume-filename=csrc/example.cpp"],
        cwd=ROOT,
        input="int  f( int a ){return a;}\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0
    assert "example.cpp" in run.stderr
