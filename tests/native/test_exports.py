"""The compiled module exports its Python entry point and nothing else (on
Linux, csrc/exports.map): the llama.cpp, ggml and C++ runtime code inside it
is bound inside it, whatever else the process has loaded."""
from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from lmsp import _native

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the export list is a Linux link option")


def test_only_the_entry_point_is_exported() -> None:
    lib = ctypes.CDLL(_native.__file__)
    assert lib.PyInit__native is not None
    for name in ("llama_backend_init", "llama_model_load_from_file", "ggml_init", "gguf_init_from_file"):
        with pytest.raises(AttributeError):
            getattr(lib, name)


def test_a_second_llama_cpp_in_the_process_takes_nothing_over(tmp_path) -> None:
    # a library defining the module's llama.cpp entry points, loaded globally
    # before the module: the module still uses its own
    src = tmp_path / "decoy.c"
    src.write_text("#include <stdlib.h>\n"
                   "void llama_backend_init(void) { abort(); }\n"
                   "void *llama_model_load_from_file(const char *p, ...) { abort(); }\n"
                   "const char *llama_print_system_info(void) { abort(); }\n")
    decoy = tmp_path / "libdecoy.so"
    built = subprocess.run(["cc", "-shared", "-fPIC", "-o", str(decoy), str(src)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    code = ("import ctypes, sys; ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL); "
            "from lmsp import native; print(len(native.system_info()) > 0)")
    run = subprocess.run([sys.executable, "-c", code, str(decoy)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True"
