#!/usr/bin/env bash
# Sets up everything on a fresh machine: a virtual environment in .venv with torch, the build
# tools, and specdec built from this source tree (CPU kernels, plus CUDA kernels when torch is a
# CUDA build and a matching nvcc exists), with the test and Hugging Face extras.
#
#   TORCH_SPEC   which torch to install (default torch==2.14.1, a CUDA 13 build; torch==2.13.0 is
#                a CPU-only build)
#   SPECDEC_CUDA ON | OFF | AUTO (default): whether to build the CUDA kernels
#   VENV         where the virtual environment goes (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet "${TORCH_SPEC:-torch==2.14.1}" \
  "scikit-build-core>=0.10" "cmake>=3.26" "ninja>=1.11" "pybind11>=2.12"
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
"$py" -m pip install --no-build-isolation ".[test,hf,bench]"
"$py" -c "import specdec; print(specdec.build_info())"
