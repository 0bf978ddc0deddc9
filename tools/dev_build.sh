#!/usr/bin/env bash
# Development build: compiles the extension into build/dev-<mode> and copies it next to the
# Python sources, so `PYTHONPATH=python pytest` runs against the working tree without a pip
# install. Usage: tools/dev_build.sh [ON|OFF|AUTO]   (CUDA kernels; default AUTO)
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-AUTO}"
build="build/dev-${mode,,}"
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$build" -G Ninja -DSPECDEC_CUDA="$mode" -DPython_EXECUTABLE="$(command -v "${PYTHON:-python3}")" \
  "${launcher[@]}" >/dev/null
cmake --build "$build"
cp "$build"/_C*.so python/specdec/
