#!/usr/bin/env bash
# The CUDA simulation (docs/cuda_simulation.md): builds csrc/cuda with the host compiler and gcov
# instrumentation into build/cuda_sim (libspecdec_cuda_sim.so), runs tests/ops on the simulated
# device (the op tests' cuda_sim parameter and the simulation's own tests), and prints
# csrc/cuda's line coverage, ending with `csrc/cuda lines executed: N of M (P%)`. Exits non-zero
# when the build or a test fails. PYTHON: the interpreter whose torch to build against and test
# with (default .venv's); extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"  # absolute, symlinks kept (a venv's)
build=build/cuda_sim
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# The venv's cmake (>= 3.26, docs/building.md) first.
export PATH="$(dirname "$py"):$PATH"
cmake -S . -B "$build" -G Ninja -DSPECDEC_CUDA=OFF -DSPECDEC_CUDA_SIM=ON \
  -DSPECDEC_CUDA_SIM_COVERAGE=ON -DPython_EXECUTABLE="$py" "${launcher[@]}" >/dev/null
cmake --build "$build" --target specdec_cuda_sim
find "$build" -name '*.gcda' -delete
status=0
SPECDEC_CUDA_SIM_LIB="$PWD/$build/libspecdec_cuda_sim.so" "$py" -m pytest -q -p no:cacheprovider \
  tests/ops -k cuda_sim "$@" || status=$?
"$py" tools/cuda_sim_coverage.py "$build"
exit "$status"
