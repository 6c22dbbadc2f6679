"""A build copied to a CPU without one of its instructions is refused in one line
(lmsp.cpu_check), before the extension loads: at import, and when the service
starts."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

from lmsp import cpu_check

X86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes asimdhp asimddp\nCPU part\t: 0xd0b\n"
AVX512_BUILD = {
    "arch": "x86_64",
    "flags": "-O3 -march=native",
    "built_on": "Intel Xeon",
    "macros": ["__AVX2__", "__FMA__", "__AVX512F__", "__AVX512VNNI__", "__AVX512BW__"],
}
# this CPU offers none of the instructions the real build needs beyond SSE2
BARE_CPU = "import lmsp.cpu_check as c; c.this_cpu = lambda: {'sse2'}\n"


def test_cpuinfo_flags_of_x86_and_arm():
    assert {"avx2", "fma", "f16c"} <= cpu_check.cpu_flags(X86)
    assert {"asimd", "asimddp"} <= cpu_check.cpu_flags(ARM)
    assert cpu_check.cpu_flags("processor\t: 0\n") == set()


def test_an_avx512_build_on_an_avx2_cpu_names_what_is_missing():
    why = cpu_check.mismatch(AVX512_BUILD, cpu_check.cpu_flags(X86), "x86_64")
    assert why is not None and "\n" not in why
    assert "avx512_vnni, avx512bw, avx512f" in why and "Intel Xeon" in why and "scripts/dev setup" in why


def test_a_build_runs_where_every_instruction_is_there():
    flags = cpu_check.cpu_flags(X86) | {"avx512f", "avx512_vnni", "avx512bw"}
    assert cpu_check.mismatch(AVX512_BUILD, flags, "x86_64") is None
    # an unreadable /proc/cpuinfo checks nothing
    assert cpu_check.mismatch(AVX512_BUILD, set(), "x86_64") is None


def test_a_build_for_another_architecture_is_refused():
    arm_build = {"arch": "aarch64", "macros": ["__ARM_NEON", "__ARM_FEATURE_DOTPROD"]}
    assert cpu_check.needed(arm_build) == ["asimd", "asimddp"]
    why = cpu_check.mismatch(arm_build, cpu_check.cpu_flags(X86), "x86_64")
    assert why is not None and "aarch64" in why


def test_the_built_module_records_what_it_needs_and_this_cpu_has_it():
    record = cpu_check.build_record()
    assert record is not None and record["arch"] == platform.machine()
    needed = cpu_check.needed(record)
    assert needed and set(needed) <= cpu_check.this_cpu()
    cpu_check.check()


def run_on_a_bare_cpu(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a new interpreter whose CPU, as lmsp.cpu_check reads it, has SSE2 only."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "LMSP_DATA_DIR": str(cwd / "data")}
    return subprocess.run([sys.executable, "-c", BARE_CPU + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env)


def test_the_import_refuses_before_the_module_loads(tmp_path):
    done = run_on_a_bare_cpu("""
        import sys
        try:
            import lmsp.native
        except c.CpuMismatch as exc:
            print(exc)
            print("loaded" if "lmsp._native" in sys.modules else "not loaded")
    """, tmp_path)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    assert lines[0].startswith("lmsp's native extension needs ") and lines[1] == "not loaded"


def test_the_service_does_not_start_and_says_why_in_one_line(tmp_path):
    done = run_on_a_bare_cpu("""
        import sys
        from gunicorn.app.wsgiapp import run
        sys.argv = ["gunicorn", "--config", "python:lmsp.serving.gunicorn_conf"]
        run()
    """, tmp_path)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    [line] = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert line.startswith("lmsp: cannot start: lmsp's native extension needs ")


def test_the_fingerprint_is_this_cpu_s():
    done = subprocess.run([sys.executable, "-m", "lmsp.cpu_check", "--fingerprint"], capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.strip() == cpu_check.fingerprint() and len(cpu_check.fingerprint()) == 16


def test_what_a_build_uses_beyond_x86_64_v3():
    assert cpu_check.beyond_x86_64_v3(AVX512_BUILD) == ["avx512_vnni", "avx512bw", "avx512f"]
    v3 = {"arch": "x86_64", "macros": ["__SSE4_2__", "__AVX__", "__AVX2__", "__FMA__", "__F16C__", "__BMI2__"]}
    assert cpu_check.beyond_x86_64_v3(v3) == []


def test_what_a_cpu_offers_beyond_x86_64_v3():
    zen3 = {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "sha_ni", "vaes"}
    assert cpu_check.cpu_beyond_x86_64_v3(zen3, "x86_64") == []
    assert cpu_check.cpu_beyond_x86_64_v3(zen3 | {"avx_vnni", "avx512f", "avx512_vnni"}, "x86_64") == [
        "avx512_vnni", "avx512f", "avx_vnni"]
    assert cpu_check.cpu_beyond_x86_64_v3({"asimd", "asimddp", "i8mm"}, "aarch64") == []
