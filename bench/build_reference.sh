#!/usr/bin/env bash
# Build llama.cpp's own llama-bench and llama-server from the pinned source,
# with the options the extension uses (CMakeLists.txt: static libraries, no
# OpenMP, no llamafile sgemm, no AMX kernels, no curl or OpenSSL, native CPU
# code), into build/reference/bin/.
#
#   bench/build_reference.sh                 CPU build
#   LMSP_CUDA=ON bench/build_reference.sh    adds the CUDA backend (arch 90;
#                                            override with CMAKE_CUDA_ARCHITECTURES)
#
# Environment: LMSP_REFERENCE_DIR (default build/reference), JOBS (default:
# all cores), PYTHON (for the fetch script; default .venv/bin/python or python3),
# LMSP_REFERENCE_TARGETS (default "llama-bench llama-server"),
# LMSP_REFERENCE_CMAKE_ARGS (more -D options, e.g. -DGGML_CUDA_FA=OFF).
# The web UI of llama-server is not built and nothing is downloaded.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${LMSP_REFERENCE_DIR:-$root/build/reference}
read -r -a targets <<<"${LMSP_REFERENCE_TARGETS:-llama-bench llama-server}"
read -r -a extra <<<"${LMSP_REFERENCE_CMAKE_ARGS:-}"
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
py=${PYTHON:-}
if [ -z "$py" ]; then
    if [ -x "$root/.venv/bin/python" ]; then py=$root/.venv/bin/python; else py=python3; fi
fi
src=$root/third_party/llama.cpp

# fetch and unpack the pinned source when it is not there yet (no-op otherwise)
if [ ! -f "$src/CMakeLists.txt" ]; then
    "$py" "$root/third_party/fetch_llama.py" --dest "$src"
fi

args=(
    -S "$src" -B "$out"
    -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_OPENMP=OFF
    -DGGML_BACKEND_DL=OFF
    -DGGML_LLAMAFILE=OFF
    -DLLAMA_CURL=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_COMMON=ON
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
)
# no AMX kernels, as in the extension (CMakeLists.txt: they fault at the pinned
# source); -mno-* wins over -march=native whatever their order
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
case "$(uname -m)" in
    x86_64|amd64)
        # shellcheck disable=SC2086  # the flags, one word each
        if echo 'int main() { return 0; }' | "${CXX:-c++}" $no_amx -x c++ -o /dev/null - >/dev/null 2>&1; then
            args+=("-DCMAKE_C_FLAGS=$no_amx" "-DCMAKE_CXX_FLAGS=$no_amx")
        fi
        ;;
esac
if command -v ninja >/dev/null 2>&1 || [ -x "$root/.venv/bin/ninja" ]; then
    export PATH=$root/.venv/bin:$PATH
    args+=(-G Ninja)
fi
if command -v ccache >/dev/null 2>&1; then
    # the same cache settings as scripts/dev, so objects shared with the
    # extension's build of the same source can be reused
    export CCACHE_BASEDIR=$root
    export CCACHE_DIR=${CCACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lmsp/ccache}
    args+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
case "${LMSP_CUDA:-OFF}" in
    ON|on|1|true|TRUE)
        args+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES:-90}")
        if command -v ccache >/dev/null 2>&1; then
            args+=(-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
        fi
        ;;
    *)
        args+=(-DGGML_CUDA=OFF)
        ;;
esac
args+=("${extra[@]}")

mkdir -p "$out"
cmake=cmake
[ -x "$root/.venv/bin/cmake" ] && cmake=$root/.venv/bin/cmake
"$cmake" "${args[@]}" >"$out/configure.log" 2>&1 || {
    cat "$out/configure.log" >&2
    echo "configure failed (log: $out/configure.log)" >&2
    exit 1
}
"$cmake" --build "$out" --config Release -j "$jobs" --target "${targets[@]}"
for tool in "${targets[@]}"; do
    test -x "$out/bin/$tool" || { echo "missing $out/bin/$tool after the build" >&2; exit 1; }
done
echo "built: ${targets[*]} in $out/bin"
