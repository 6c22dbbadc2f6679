"""The tiled products on ARM (csrc/tile_matmul_neon.cpp), checked without an
ARM machine: ggml's base and CPU libraries of the pinned source, our tiles
and tests/native/arm/tile_check.cpp are built for aarch64 with Debian's cross
compiler (cmake/aarch64-linux-gnu.cmake) and run under qemu-user, where
every tile shape and remainder of every type is compared with ggml's NEON
vec_dot bit for bit. The extension's own sources are cross-compiled too.

The build is kept in build/aarch64-linux-gnu/ and redone only where sources
changed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pybind11
import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "aarch64-linux-gnu"
# the cross compiler and the emulator, by the Debian package that has them
TOOLS = {"aarch64-linux-gnu-g++": "g++-aarch64-linux-gnu", "qemu-aarch64": "qemu-user"}
# -march of ggml, the tiles and the check: dot products, no i8mm (ggml's
# one-row products are the same NEON code with i8mm; tile_matmul_neon.cpp
# says what differed in a build with +i8mm)
ARCH = "armv8.2-a+dotprod"


def _env() -> dict[str, str]:
    """PATH with the virtual environment's cmake and ninja."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1800)


def _tools_present() -> None:
    missing = {tool: package for tool, package in TOOLS.items() if shutil.which(tool) is None}
    if missing:
        pytest.fail(f"the ARM tile check needs {' and '.join(missing)}: apt-get install {' '.join(missing.values())}"
                    " (scripts/dev test installs them)")


def _build(target: str) -> Path:
    """Builds `target` in BUILD, configured on first use."""
    _tools_present()
    if not (BUILD / "build.ninja").exists():
        cmd = ["cmake", "-S", "tests/native/arm", "-B", str(BUILD), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
               f"-DCMAKE_TOOLCHAIN_FILE={ROOT / 'cmake' / 'aarch64-linux-gnu.cmake'}",
               f"-DLMSP_ARM_ARCH={ARCH}", f"-DLMSP_PYTHON_INCLUDE={sysconfig.get_paths()['include']}",
               f"-DLMSP_PYBIND11_INCLUDE={pybind11.get_include()}"]
        if shutil.which("ccache"):
            cmd += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        done = _run(cmd)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    done = _run(["cmake", "--build", str(BUILD), "--target", target])
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-4000:]
    return BUILD


@pytest.mark.parametrize("cpu", ["max", "cortex-a76"])
def test_arm_tiles_equal_ggmls_neon_vec_dot_bit_for_bit(cpu: str) -> None:
    # max: every extension qemu has (i8mm, SVE); cortex-a76 (Raspberry Pi 5,
    # RK3588): dot products only
    check = _build("tile_check") / "tile_check"
    done = subprocess.run(["qemu-aarch64", "-cpu", cpu, str(check)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert done.stdout.strip().endswith("checked against vec_dot: 0 differences"), done.stdout[-2000:]


def test_the_extensions_native_code_cross_compiles_for_aarch64() -> None:
    # csrc/*.cpp as objects, with pybind11 and this Python's headers: a
    # compile check (nothing links them for ARM here)
    objects = _build("lmsp_native_objects")
    compiled = {p.name for p in objects.rglob("*.cpp.o") if "lmsp_native_objects.dir" in p.parts}
    assert compiled >= {p.name + ".o" for p in (ROOT / "csrc").glob("*.cpp")}
