#!/usr/bin/env bash
# Prepare, on a machine with network, what bench/gpu.sh needs on a GPU
# machine that has none:
#   .gpu/llama.cpp   the pinned llama.cpp source (third_party/llama.cpp),
#                    without the parts no CPU or CUDA build of ours reads
#                    (other backends, tests, examples, the web UI's sources);
#   .whl/            wheels of the service's requirements, of gguf and of the
#                    build backend, for the GPU machine's Python (PYVER,
#                    default 3.12).
# Both folders are ignored by git (.git/info/exclude); carry them along:
#   carry: [".gpu", ".whl"], then: ln -sfn "$PWD/.gpu/llama.cpp" third_party/llama.cpp
#
#   bench/gpu_pack.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
pyver=${PYVER:-3.12}
py=${PYTHON:-}
if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi

src=third_party/llama.cpp
[ -f "$src/CMakeLists.txt" ] || "$py" third_party/fetch_llama.py --dest "$src"

# ------------------------------------------------------------ pruned source
dst=.gpu/llama.cpp
rm -rf "$dst"
mkdir -p .gpu
cp -a "$src" "$dst"
(
    cd "$dst"
    rm -rf tests benches examples pocs conversion skills ci \
        tools/ui/src tools/ui/tests tools/ui/static
    for backend in ggml/src/ggml-*/; do
        case "$backend" in
            ggml/src/ggml-cpu/|ggml/src/ggml-cuda/) ;;
            *) rm -rf "$backend" ;;
        esac
    done
)

# ------------------------------------------------------------ wheels
mkdir -p .whl
pkgs=(falcon gunicorn gevent greenlet zope.event zope.interface gguf scikit-build-core pybind11 pip)
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${pkgs[@]}"
for f in .gpu .whl; do
    grep -qx "/$f/" .git/info/exclude 2>/dev/null || echo "/$f/" >>.git/info/exclude
done
du -sh .gpu .whl
