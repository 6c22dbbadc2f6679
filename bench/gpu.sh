#!/usr/bin/env bash
# The native benchmark on a CUDA machine, in one go:
#   1. a virtual environment (build/gpu-venv) from the wheels in .whl/ (no
#      network): only what the build and bench/native.py need;
#   2. the extension built with CUDA (LMSP_CUDA=ON, arch 90) into that venv;
#   3. llama-bench built with CUDA from the same source (bench/build_reference.sh);
#   4. bench/native.py with every layer on the GPU; figures on stdout, the
#      JSON report and logs copied to $OUT when it is set.
#
#   bench/gpu.sh [extra bench/native.py options]
#
# Environment: CUDA_ARCH (default 90), JOBS (default: all cores), PYTHON
# (default python3), LMSP_GPU_CPU_ONLY=1 runs the same steps without CUDA (to
# check this script on a machine without a GPU), LMSP_GPU_SERVER=1 also builds
# llama-server and then runs the serving benchmark (5. bench/serve.py, lmsp
# against llama-server with every layer on the GPU), LMSP_GPU_NATIVE=0 skips
# step 4. Steps whose output is already there are skipped, so a second
# run after a timeout continues where the first stopped.
#
# Both builds leave out the flash-attention CUDA kernels (GGML_CUDA_FA=OFF):
# the engine runs with flash attention off, they are the largest part of the
# CUDA compile, and llama-bench is then compared with the engine's settings.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
start=$SECONDS
say() { printf '[gpu.sh %4ds] %s\n' "$((SECONDS - start))" "$*"; }

py=${PYTHON:-python3}
venv=$root/build/gpu-venv
wheels=$root/.whl
jobs=${JOBS:-$(nproc)}
arch=${CUDA_ARCH:-90}
cuda=ON
[ "${LMSP_GPU_CPU_ONLY:-0}" = 1 ] && cuda=OFF
logs=$root/bench/out/gpu-logs
mkdir -p "$logs"

finish() {
    rc=$?
    if [ -n "${OUT:-}" ]; then
        mkdir -p "$OUT"
        cp -r "$logs" "$OUT/" 2>/dev/null || true
        cp "$root"/bench/out/native-*.json "$OUT/" 2>/dev/null || true
        cp "$root"/bench/out/serve-gpu.json "$OUT/" 2>/dev/null || true
    fi
    say "done (exit $rc)"
}
trap finish EXIT

if [ "$cuda" = ON ]; then
    for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
        if [ -x "$d/nvcc" ] && ! command -v nvcc >/dev/null 2>&1; then export PATH=$d:$PATH; fi
    done
    command -v nvcc >/dev/null 2>&1 || { echo "nvcc not found: is the CUDA toolkit installed?" >&2; exit 1; }
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi

# ---------------------------------------------------------------- 1. Python
if [ ! -x "$venv/bin/python" ]; then
    say "venv $venv"
    if ! "$py" -m venv --system-site-packages "$venv" >"$logs/venv.log" 2>&1; then
        # no ensurepip: a venv without pip, then pip from its own wheel
        rm -rf "$venv"
        "$py" -m venv --system-site-packages --without-pip "$venv"
        pipwhl=$(ls "$wheels"/pip-*.whl 2>/dev/null | head -1)
        [ -n "$pipwhl" ] || { echo "no pip in $py and no pip wheel in .whl/" >&2; exit 1; }
        "$venv/bin/python" "$pipwhl/pip" install -q --no-index --find-links "$wheels" pip
    fi
fi
vpy=$venv/bin/python
pipi() { "$vpy" -m pip install -q --disable-pip-version-check --no-index --find-links "$wheels" "$@"; }
need=()
"$vpy" -c "import numpy" 2>/dev/null || need+=(numpy)
"$vpy" -c "import yaml" 2>/dev/null || need+=(pyyaml)
"$vpy" -c "import scikit_build_core" 2>/dev/null || need+=(scikit-build-core)
"$vpy" -c "import pybind11" 2>/dev/null || need+=(pybind11)
if ! command -v cmake >/dev/null 2>&1 && [ ! -x "$venv/bin/cmake" ]; then need+=(cmake); fi
if ! command -v ninja >/dev/null 2>&1 && [ ! -x "$venv/bin/ninja" ]; then need+=(ninja); fi
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]} from .whl/"
    pipi "${need[@]}"
fi
# gguf's other requirements (requests, tqdm) are not needed to read and write files
"$vpy" -c "import gguf" 2>/dev/null || pipi --no-deps gguf
export PATH=$venv/bin:$PATH

if command -v ccache >/dev/null 2>&1; then
    # one cache for both builds: the second reuses what the first compiled
    export CCACHE_BASEDIR=$root CCACHE_DIR=${CCACHE_DIR:-$root/build/ccache-gpu}
    launch="-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
else
    launch=""
fi

# ---------------------------------------------------------------- 2. extension
if "$vpy" -c "import lmsp._native, sys; sys.exit(0 if ('CUDA' in lmsp._native.system_info()) == ('$cuda' == 'ON') else 1)" 2>/dev/null; then
    say "extension already built"
else
    say "building the extension (LMSP_CUDA=$cuda, arch $arch, -j$jobs)"
    export LMSP_CUDA=$cuda CMAKE_BUILD_PARALLEL_LEVEL=$jobs
    export CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=$arch -DGGML_CUDA_FA=OFF $launch"
    if ! "$vpy" -m pip install --disable-pip-version-check --no-index --no-deps --no-build-isolation \
            --config-settings=build-dir="$root/build/gpu-ext" "$root" >"$logs/extension.log" 2>&1; then
        tail -40 "$logs/extension.log" >&2
        exit 1
    fi
    unset CMAKE_ARGS
fi
"$vpy" -c "import lmsp.native as n; print(n.system_info())"

# ---------------------------------------------------------------- 3. llama-bench
ref=$root/build/reference-gpu
[ "$cuda" = OFF ] && ref=$root/build/reference
if [ -x "$ref/bin/llama-bench" ] && { [ "${LMSP_GPU_SERVER:-0}" != 1 ] || [ -x "$ref/bin/llama-server" ]; }; then
    say "llama-bench already built"
else
    say "building llama-bench (GGML_CUDA=$cuda, -j$jobs)"
    targets="llama-bench"
    [ "${LMSP_GPU_SERVER:-0}" = 1 ] && targets="llama-bench llama-server"
    if ! LMSP_CUDA=$cuda CMAKE_CUDA_ARCHITECTURES=$arch JOBS=$jobs PYTHON=$vpy \
            LMSP_REFERENCE_DIR=$ref LMSP_REFERENCE_TARGETS="$targets" \
            LMSP_REFERENCE_CMAKE_ARGS="-DGGML_CUDA_FA=OFF" \
            bench/build_reference.sh >"$logs/reference.log" 2>&1; then
        tail -40 "$logs/reference.log" >&2
        exit 1
    fi
fi

# ---------------------------------------------------------------- 4. benchmark
ngl=99
[ "$cuda" = OFF ] && ngl=0
if [ "${LMSP_GPU_NATIVE:-1}" = 1 ]; then
say "bench/native.py"
"$vpy" bench/native.py --llama-bench "$ref/bin/llama-bench" --n-gpu-layers "$ngl" \
    --llama-bench-configs matched --parallel 1,2,4,8,16 "$@" 2>&1 | tee "$logs/native.log"
fi

# ---------------------------------------------------------------- 5. serving
if [ "${LMSP_GPU_SERVER:-0}" = 1 ]; then
    # bench/serve.py starts `lmsp serve`: the service's own requirements, from .whl/
    "$vpy" -c "import falcon, gunicorn, gevent" 2>/dev/null ||
        pipi --no-deps falcon gunicorn gevent greenlet zope.event zope.interface
    models=(--models tiny,bench)
    if [ -f bench/out/models/tiny.gguf ] && [ -f bench/out/models/bench.gguf ]; then
        models=(--models "" --model-file bench/out/models/tiny.gguf --model-file bench/out/models/bench.gguf)
    fi
    say "bench/serve.py"
    "$vpy" bench/serve.py "${models[@]}" --llama-server "$ref/bin/llama-server" --lmsp "$venv/bin/lmsp" \
        --n-gpu-layers "$ngl" --threads "${LMSP_GPU_SERVE_THREADS:-4}" --clients 1,16,64 \
        --requests-per-client 1 --min-requests 8 --max-tokens 64 \
        --json "$root/bench/out/serve-gpu.json" 2>&1 | tee "$logs/serve.log"
fi
