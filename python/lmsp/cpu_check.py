"""Whether this CPU runs the instructions the native extension was compiled for.

The extension is built for the CPU of the machine that builds it
(``-march=native``). The build writes the compiler's target macros beside the
module (``_native.cpu.json``, see CMakeLists.txt); :func:`check` compares them
with what this CPU reports, before the module is loaded, so that a build
copied to a CPU without one of its instructions is refused in one line instead
of dying of SIGILL in the middle of a request.

``python -m lmsp.cpu_check`` prints that line and exits 1 on a mismatch, 0
otherwise; ``--fingerprint`` prints what identifies this CPU's instruction sets
(``scripts/dev`` rebuilds when it is not the one the build was made on);
``--beyond-x86-64-v3`` the instruction sets the build uses beyond AVX2's level
(``scripts/dev test`` then runs a tier on an x86-64-v3 build too), and
``--cpu-beyond-x86-64-v3`` those this CPU has, which a build for it will use
(where there is no build yet).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import platform
import sys
from pathlib import Path
from typing import Any

# compiler macro -> the flag the kernel lists for it in /proc/cpuinfo (x86 "flags",
# ARM "Features"); a macro missing here is not checked
CPUINFO_FLAGS = {
    "__SSE4_2__": "sse4_2",
    "__AVX__": "avx",
    "__AVX2__": "avx2",
    "__FMA__": "fma",
    "__F16C__": "f16c",
    "__BMI2__": "bmi2",
    "__AVXVNNI__": "avx_vnni",
    "__AVX512F__": "avx512f",
    "__AVX512BW__": "avx512bw",
    "__AVX512CD__": "avx512cd",
    "__AVX512DQ__": "avx512dq",
    "__AVX512VL__": "avx512vl",
    "__AVX512VNNI__": "avx512_vnni",
    "__AVX512BF16__": "avx512_bf16",
    "__AVX512FP16__": "avx512_fp16",
    "__AVX512VBMI__": "avx512vbmi",
    "__AVX512VBMI2__": "avx512_vbmi2",
    "__AVX512IFMA__": "avx512ifma",
    "__AVX512BITALG__": "avx512_bitalg",
    "__AVX512VPOPCNTDQ__": "avx512_vpopcntdq",
    "__ARM_NEON": "asimd",
    "__ARM_FEATURE_DOTPROD": "asimddp",
    "__ARM_FEATURE_MATMUL_INT8": "i8mm",
    "__ARM_FEATURE_SVE": "sve",
    "__ARM_FEATURE_FP16_VECTOR_ARITHMETIC": "asimdhp",
}
X86_64_V3 = ("sse4_2", "avx", "avx2", "fma", "f16c", "bmi2")
REBUILD = "rebuild it on this machine: scripts/dev setup (or pip install --force-reinstall .)"


class CpuMismatch(ImportError):
    """The extension uses instructions this CPU does not have."""


def cpu_flags(cpuinfo: str) -> set[str]:
    """The instruction-set flags of the first processor in a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def this_cpu() -> set[str]:
    """This CPU's flags (empty where /proc/cpuinfo cannot be read: nothing is checked then)."""
    try:
        return cpu_flags(Path("/proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        return set()


def needed(build: dict[str, Any]) -> list[str]:
    """The cpuinfo flags a build needs, from its target macros."""
    return sorted({CPUINFO_FLAGS[m] for m in build.get("macros", ()) if m in CPUINFO_FLAGS})


def mismatch(build: dict[str, Any], flags: set[str], machine: str) -> str | None:
    """Why a build cannot run on a CPU with ``flags`` (None: it can)."""
    if build.get("arch") and build["arch"] != machine:
        return f"lmsp's native extension was built for {build['arch']}; this machine is {machine}: {REBUILD}"
    if not flags:
        return None
    missing = [flag for flag in needed(build) if flag not in flags]
    if not missing:
        return None
    where = f" (built on {build['built_on']}, {build.get('flags', '')})" if build.get("built_on") else ""
    return (
        f"lmsp's native extension needs {', '.join(missing)}, which this CPU lacks{where}; "
        f"this CPU has {', '.join(sorted(set(needed(build)) & flags)) or 'none of its instruction sets'}: {REBUILD}"
    )


def build_record() -> dict[str, Any] | None:
    """The built module's ``_native.cpu.json`` (None: no module, or a build without it)."""
    spec = importlib.util.find_spec("lmsp._native")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).with_name("_native.cpu.json")
    try:
        record: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record


def check() -> None:
    """CpuMismatch (one line) when the built module needs what this CPU lacks."""
    build = build_record()
    if build is None:
        return
    why = mismatch(build, this_cpu(), platform.machine())
    if why is not None:
        raise CpuMismatch(why)


def fingerprint() -> str:
    """What identifies this machine's instruction sets: its architecture and the
    flags the checks know of."""
    known = sorted(this_cpu() & set(CPUINFO_FLAGS.values()))
    return hashlib.sha256(" ".join([platform.machine(), *known]).encode()).hexdigest()[:16]


def beyond_x86_64_v3(build: dict[str, Any]) -> list[str]:
    """The cpuinfo flags an x86 build needs beyond x86-64-v3's (AVX2, FMA, F16C, BMI2)."""
    return [flag for flag in needed(build) if flag not in X86_64_V3]


def cpu_beyond_x86_64_v3(flags: set[str], machine: str) -> list[str]:
    """The flags an x86 CPU has that the checks know, beyond x86-64-v3's: those a
    build for it (``-march=native``) uses beyond AVX2's level."""
    if machine not in ("x86_64", "AMD64"):
        return []
    known = set(CPUINFO_FLAGS.values())
    return sorted(flag for flag in flags if flag in known and flag not in X86_64_V3)


def main(argv: list[str]) -> int:
    if argv == ["--fingerprint"]:
        print(fingerprint())
        return 0
    if argv == ["--beyond-x86-64-v3"]:
        print(" ".join(beyond_x86_64_v3(build_record() or {})))
        return 0
    if argv == ["--cpu-beyond-x86-64-v3"]:
        print(" ".join(cpu_beyond_x86_64_v3(this_cpu(), platform.machine())))
        return 0
    try:
        check()
    except CpuMismatch as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
