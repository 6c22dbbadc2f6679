#!/usr/bin/env bash
# The GPU figures in one prepared run, on a CUDA machine that has no network
# (bench/gpu_pack.sh prepares what it needs: .gpu/llama.cpp and .whl/):
#   1. Python: a venv over the machine's own packages (build/gpu-venv) with
#      the wheels of .whl/ installed into it;
#   2. the demo models tiny, bench and large, written while step 3 builds;
#   3. the extension built with CUDA (LMSP_CUDA=ON, arch 90) and
#      LMSP_LLAMA_TOOLS=ON, then llama-bench and llama-server from the same
#      build tree: ggml and llama are compiled once, and the references run
#      the very libraries the extension runs;
#   4. bench/gpu_smoke.py: the engine in fresh processes set up as the
#      service and the tests set up theirs, then bench/native.py: the
#      extension against llama-bench, every layer on the GPU;
#   5. bench/serve.py: lmsp against llama-server, every layer on the GPU;
#   6. the native engine tests with their engines on the GPU
#      (LMSP_TEST_N_GPU_LAYERS=99): which of the CPU's properties hold there.
# Steps 4-6 run even when another of them failed. A step that would start
# after LMSP_GPU_BUDGET_S seconds (default 540) is skipped, and every step's
# results are copied to $OUT (when set) as soon as it ends. The result files
# are named as bench/results/ names them (bench/results_path.py): they go
# there as they are.
#
#   bench/gpu.sh
#
# Environment: CUDA_ARCH (default 90), JOBS (default: all cores), PYTHON
# (default python3), LMSP_GPU_WHEELS (default .whl), LMSP_GPU_CPU_ONLY=1 (the
# same steps without CUDA: a check of this script on a machine without a
# GPU), LMSP_GPU_STEPS (default "smoke native serve tests"; empty: build
# only), LMSP_GPU_MODELS (default "tiny bench large"), LMSP_GPU_SERVE_MODELS
# (default "tiny bench"), LMSP_GPU_THREADS (default 4). Steps whose output is
# already there (venv, build, models) are not redone.
#
# The build leaves out the flash-attention CUDA kernels (GGML_CUDA_FA=OFF):
# on a GPU the engine runs with flash attention off (csrc/batch_plan.cpp), and
# llama-bench and llama-server are run with it off as well.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
start=$SECONDS
budget=${LMSP_GPU_BUDGET_S:-540}
say() { printf '[gpu.sh %4ds] %s\n' "$((SECONDS - start))" "$*"; }
die() { say "error: $*"; exit 1; }

py=${PYTHON:-python3}
venv=$root/build/gpu-venv
vpy=$venv/bin/python
wheels=${LMSP_GPU_WHEELS:-$root/.whl}
jobs=${JOBS:-$(nproc)}
arch=${CUDA_ARCH:-90}
threads=${LMSP_GPU_THREADS:-4}
read -r -a steps <<<"${LMSP_GPU_STEPS-smoke native serve tests}"
read -r -a models <<<"${LMSP_GPU_MODELS:-tiny bench large}"
read -r -a serve_models <<<"${LMSP_GPU_SERVE_MODELS:-tiny bench}"
cuda=ON ngl=99
if [ "${LMSP_GPU_CPU_ONLY:-0}" = 1 ]; then cuda=OFF ngl=0; fi
build=$root/build/gpu-ext
out=$root/bench/out/gpu
logs=$out/logs
mkdir -p "$logs"

# Results to $OUT after every step: the JSON reports and one archive of the logs.
save() {
    [ -n "${OUT:-}" ] || return 0
    mkdir -p "$OUT"
    cp "$out"/*.json "$OUT/" 2>/dev/null
    # with the servers' own logs of the serving benchmark
    tar -czf "$OUT/gpu-logs.tar.gz" -C "$out" logs $(cd "$out" && ls -d serve/logs 2>/dev/null) 2>/dev/null
    return 0
}
trap 'rc=$?; save; say "done (exit $rc)"' EXIT

# Runs step $1 (a function) with a log, unless the budget is spent; the
# function runs its commands under `limited`, which ends them with the budget.
status=()
limit=0
limited() { timeout --kill-after=10 "$limit" "$@"; }
step() {
    local name=$1
    limit=$((budget - (SECONDS - start)))
    if [ "$limit" -lt 20 ]; then
        say "$name: skipped (budget of ${budget}s spent)"
        status+=("$name=skipped")
        return 0
    fi
    say "$name (at most ${limit}s)"
    if "$name" 2>&1 | tee "$logs/$name.log"; then
        status+=("$name=ok")
    else
        status+=("$name=failed")
        say "$name failed"
    fi
    save
}

# ---------------------------------------------------------------- 0. machine
if [ "$cuda" = ON ]; then
    for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
        if [ -x "$d/nvcc" ] && ! command -v nvcc >/dev/null 2>&1; then export PATH=$d:$PATH; fi
    done
    command -v nvcc >/dev/null 2>&1 || die "nvcc not found: is the CUDA toolkit installed?"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem \
        --format=csv | tee "$logs/gpu.txt"
    nvcc --version | tail -2 | tee -a "$logs/gpu.txt"
fi
{ "$py" -c "import sys; print(sys.executable, sys.version.split()[0])"; command -v cmake ninja nvcc; nproc; } 2>&1 |
    tee -a "$logs/gpu.txt"
if [ ! -f third_party/llama.cpp/CMakeLists.txt ] && [ -f .gpu/llama.cpp/CMakeLists.txt ]; then
    ln -sfn "$root/.gpu/llama.cpp" third_party/llama.cpp
fi
[ -f third_party/llama.cpp/CMakeLists.txt ] || die "no llama.cpp source: run bench/gpu_pack.sh where there is network"

# ---------------------------------------------------------------- 1. Python
if [ ! -x "$vpy" ]; then
    say "venv $venv"
    "$py" -m venv --without-pip --system-site-packages "$venv" || die "python3 -m venv failed"
    # the packages of the Python it was made from, also when that is itself a venv
    purelib=$("$vpy" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    "$py" -c "import site; print('\n'.join(site.getsitepackages()))" >"$purelib/_gpu_host.pth"
    if ! "$vpy" -m pip --version >/dev/null 2>&1; then
        # no pip in that Python: pip from its own wheel
        pipwhl=$(ls "$wheels"/pip-*.whl 2>/dev/null | head -1)
        [ -n "$pipwhl" ] || die "no pip in $py and no pip wheel in $wheels"
        "$vpy" "$pipwhl/pip" install -q --disable-pip-version-check --no-index "$pipwhl" || die "pip from $pipwhl failed"
    fi
    if ls "$wheels"/*.whl >/dev/null 2>&1; then
        "$vpy" -m pip install -q --disable-pip-version-check --no-index --no-deps "$wheels"/*.whl ||
            die "installing $wheels failed"
    fi
fi
"$vpy" -c "import numpy, gguf, pybind11, scikit_build_core" || die "the venv lacks what the build needs"
export PATH=$venv/bin:$PATH

# ---------------------------------------------------------------- 2. models
mkdir -p bench/out/models
(
    for m in "${models[@]}"; do
        f=bench/out/models/$m.gguf
        [ -f "$f" ] || PYTHONPATH=$root/python "$vpy" bench/bench_models.py "$m" "$f"
    done
) >"$logs/models.log" 2>&1 &
models_pid=$!

# ---------------------------------------------------------------- 3. build
# The installed module has no RPATH into the CUDA toolkit: its libraries go
# on LD_LIBRARY_PATH for every step.
if [ "$cuda" = ON ]; then
    tk=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    [ -x /usr/local/cuda/bin/nvcc ] && tk=/usr/local/cuda
    export LD_LIBRARY_PATH=$tk/lib64:$(ls -d "$tk"/targets/*/lib 2>/dev/null | head -1)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

build_all() {
    if "$vpy" -c "import lmsp._native as n, sys; sys.exit(0 if ('CUDA' in n.system_info()) == ('$cuda' == 'ON') else 1)" 2>/dev/null \
            && [ -x "$build/bin/llama-bench" ] && [ -x "$build/bin/llama-server" ]; then
        echo "already built"
        return 0
    fi
    export LMSP_CUDA=$cuda CMAKE_BUILD_PARALLEL_LEVEL=$jobs
    export CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=$arch -DGGML_CUDA_FA=OFF -DLMSP_LLAMA_TOOLS=ON"
    CMAKE_ARGS+=" -Dpybind11_DIR=$("$vpy" -m pybind11 --cmakedir)"
    limited "$vpy" -m pip install --disable-pip-version-check --no-index --no-deps --no-build-isolation \
        --config-settings=build-dir="$build" "$root" || return 1
    limited cmake --build "$build" -j "$jobs" --target llama-bench llama-server || return 1
    "$vpy" -c "import lmsp.native as n; print(n.system_info())"
}
t0=$SECONDS
step build_all
say "build: $((SECONDS - t0))s"
[[ " ${status[*]} " == *" build_all=ok "* ]] || die "the build failed: $logs/build_all.log"
wait "$models_pid" || { cat "$logs/models.log"; die "writing the demo models failed"; }
model_files=()
for m in "${models[@]}"; do model_files+=(--model-file "bench/out/models/$m.gguf"); done

# ---------------------------------------------------------------- 4-6
smoke() {
    limited "$vpy" bench/gpu_smoke.py "bench/out/models/${models[0]}.gguf" --n-gpu-layers "$ngl"
}
native() {
    limited "$vpy" bench/native.py --models "" "${model_files[@]}" --out-dir "$out" --results-dir "$out" \
        --llama-bench "$build/bin/llama-bench" --llama-bench-configs matched \
        --n-gpu-layers "$ngl" --threads "$threads" --parallel 1,4,16,64 --reps 3
}
serve() {
    local files=()
    for m in "${serve_models[@]}"; do files+=(--model-file "bench/out/models/$m.gguf"); done
    limited "$vpy" bench/serve.py --models "" "${files[@]}" --llama-server "$build/bin/llama-server" \
        --llama-arg=-fa --llama-arg=off --lmsp "$venv/bin/lmsp" --servers llama,lmsp,lmsp-memevents \
        --n-gpu-layers "$ngl" --threads "$threads" --clients 1,64 --rounds 1 \
        --requests-per-client 1 --min-requests 8 --max-tokens 64 --work-dir "$out/serve" \
        --json "$out/serve/results.json" --results-dir "$out"
}
tests() {
    limited env LMSP_TEST_N_GPU_LAYERS="$ngl" "$vpy" -m pytest -q -p no:cacheprovider \
        tests/native/test_engine.py tests/native/test_resume.py
}
export PYTHONUNBUFFERED=1
for s in "${steps[@]}"; do step "$s"; done
say "steps: ${status[*]}"
