#!/usr/bin/env bash
# The GPU check (docs/cuda_kernels.md, "The GPU check"): everything a GPU machine should tell us
# about the CUDA kernels, in ONE call that ends within 600 s on one H200 (16 cores, a fresh clone,
# a CUDA toolkit and torch; no network needed). Steps, in order, each under its own time limit
# so that a slow or hung step cannot eat the others' time:
#   build      the extension for this GPU's architecture only (ccache when present), in place
#   tests      the op, model, decoder and proposer tests that run on CUDA (tools/gpu_check/cuda_only.py
#              keeps the tests parametrised with the device "cuda"), JUnit XML in $OUT/junit.xml
#   memcheck, racecheck, synccheck
#              compute-sanitizer over tools/gpu_check/kernels_once.py (every kernel once)
#   graph      a verification step captured in a CUDA graph and replayed, against eager
#   timings    CUDA-event timings: tree_attention vs SDPA, the sampling ops' HBM bandwidth, every
#              op vs its plain-torch reference ($OUT/timings.md)
#   decode     an end-to-end greedy decode on cuda, identical to the target alone
# It always ends with $OUT/summary.md (also printed, and rewritten after every step), which
# names every failure and timeout. Exit status 0 when every step passed.
#
# At most 7 files go to $OUT (default bench/results/gpu): summary.md, junit.xml, timings.md,
# build.log, tests.log, sanitizer.log, checks.log.
#
#   PYTHON            interpreter with torch (default .venv/bin/python if present, else python3)
#   CUDAARCHS         CMake CUDA architectures (default: the GPU's own, e.g. 90-real on an H200)
#   GPU_CHECK_STEPS   comma-separated steps to run (default: all, in the order above); a rerun
#                     on a machine that kept the build can skip to the failed ones
#   GPU_CHECK_BUDGET  seconds for the whole check (default 570)
#   GPU_CHECK_TESTS   test paths (default: tests/ops tests/model tests/loop tests/proposers,
#                     without tests/loop/test_random_configs.py, which CI's CPU runs cover)
#   GPU_CHECK_TEST_JOBS  pytest-xdist workers for the tests (default 4 when pytest-xdist is
#                     installed, else 1; with 1 a timeout also names the test that was running)
#   GPU_CHECK_DEVICE  cuda (default); cpu checks this script where there is no GPU: it runs the
#                     graph, timings (tiny shapes) and decode steps on the CPU, nothing else
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out="${OUT:-bench/results/gpu}"
mkdir -p "$out" && out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
t_start=$(date +%s)
budget=${GPU_CHECK_BUDGET:-570}
deadline=$((t_start + budget))

all_steps=(build tests memcheck racecheck synccheck graph timings decode)
# Each step's own limit (seconds); their sum is the default budget. A step may use what the
# steps before it left unused, never what the steps after it are allotted.
declare -A default_limit=([build]=150 [tests]=170 [memcheck]=50 [racecheck]=50 [synccheck]=35
  [graph]=30 [timings]=45 [decode]=40)
device=${GPU_CHECK_DEVICE:-cuda}
case $device in
  cuda) default_steps=$(IFS=,; echo "${all_steps[*]}") ;;
  cpu) default_steps=graph,timings,decode ;;
  *) echo "gpu_check: GPU_CHECK_DEVICE must be cuda or cpu, not '$device'" >&2; exit 2 ;;
esac
IFS=, read -r -a steps <<< "${GPU_CHECK_STEPS:-$default_steps}"
for s in "${steps[@]}"; do
  [ -n "${default_limit[$s]:-}" ] || { echo "gpu_check: unknown step '$s' (steps: ${all_steps[*]})" >&2; exit 2; }
done
declare -A result seconds granted note
for s in "${steps[@]}"; do result[$s]="not run"; done

if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
py=$(command -v "$PYTHON" || true)
[ -n "$py" ] && case "$py" in /*) ;; *) py="$root/$py" ;; esac
# The venv's tools (cmake >= 3.26, ninja) first; the CUDA toolkit when it is not on PATH.
[ -n "$py" ] && export PATH="$(dirname "$py"):$PATH"
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="$PATH:/usr/local/cuda/bin"; fi
sanitizer=$(command -v compute-sanitizer || true)
if [ -z "$sanitizer" ] && command -v nvcc >/dev/null; then
  candidate="$(dirname "$(command -v nvcc)")/compute-sanitizer"
  [ -x "$candidate" ] && sanitizer=$candidate
fi
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# The extension must run on the libstdc++ of the compiler that builds it: where a Python
# process loads another one first, formatting an error message can crash inside it
# (docs/cuda_kernels.md, "Runs on a GPU").
cxx_runtime=$(c++ -print-file-name=libstdc++.so.6 2>/dev/null || true)
case "$cxx_runtime" in
  /*) [ -f "$cxx_runtime" ] && export LD_PRELOAD="$cxx_runtime${LD_PRELOAD:+:$LD_PRELOAD}" ;;
esac

# --- the summary, rewritten after every step ---------------------------------------------------
header=""
summarize() {
  local s failures
  {
    echo "# GPU check: $(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo
    printf '%s\n' "$header"
    echo
    echo "| step | result | time | limit | note |"
    echo "|---|---|---|---|---|"
    for s in "${steps[@]}"; do
      echo "| $s | ${result[$s]} | ${seconds[$s]:--} s | ${granted[$s]:--} s | ${note[$s]:-} |"
    done
    echo
    failures=0
    for s in "${steps[@]}"; do
      case "${result[$s]}" in ok) ;; *) failures=1 ;; esac
    done
    if [ "$failures" = 1 ]; then
      echo "## Failures"
      for s in "${steps[@]}"; do
        case "${result[$s]}" in ok) continue ;; esac
        echo
        echo "### $s: ${result[$s]}"
        if [ -s "$work/$s.detail" ]; then sed 's/^/    /' "$work/$s.detail"; fi
      done
      echo
    else
      echo "Every step passed."
      echo
    fi
    echo "Files: summary.md, junit.xml (tests), timings.md, build.log, tests.log, sanitizer.log" \
      "(memcheck, racecheck, synccheck), checks.log (GPU, graph, timings and decode output)."
  } > "$out/summary.md"
}

finished=0
finish() {
  [ "$finished" = 1 ] && return
  finished=1
  summarize
  cat "$out/summary.md"
  rm -rf "$work"
}
trap finish EXIT
trap 'exit 130' INT TERM

# Seconds step $1 may run: what is left of the budget minus the limits of the steps after it
# (and 5 s for timeout's grace before a kill).
limit_for() {
  local after=0 seen=0 s
  for s in "${steps[@]}"; do
    if [ "$seen" = 1 ]; then after=$((after + default_limit[$s])); fi
    [ "$s" = "$1" ] && seen=1
  done
  # With a budget smaller than the defaults, the earlier steps come first.
  local left=$((deadline - $(date +%s) - 5))
  local mine=$((left - after)) fallback=$((default_limit[$1] < left ? default_limit[$1] : left))
  echo $((mine > fallback ? mine : fallback))
}

# run STEP SIGNAL COMMAND...: runs the command under its limit (SIGNAL first: INT lets Python and
# pytest report where they were; then KILL after 5 s), output in $work/STEP.out.
run() {
  local s=$1 sig=$2; shift 2
  local lim; lim=$(limit_for "$s")
  granted[$s]=$lim
  if [ "$lim" -lt 5 ]; then
    result[$s]="not run"; note[$s]="no time left in the budget (${budget} s)"
    echo "${note[$s]}" | tee "$work/$s.detail" > "$work/$s.out"
    return 1
  fi
  result[$s]="running"
  summarize
  local t0; t0=$(date +%s)
  timeout -s "$sig" -k 5 "$lim" "$@" > "$work/$s.out" 2>&1
  local rc=$?
  seconds[$s]=$(( $(date +%s) - t0 ))
  case $rc in
    0) result[$s]=ok ;;
    124|137) result[$s]="TIMEOUT" ;;
    *) result[$s]="FAIL (exit $rc)" ;;
  esac
  return $rc
}

# Appends a step's output to one of the logs that come back.
keep() {  # keep STEP LOG
  { echo "===== $1: ${result[$1]} (${seconds[$1]:-?} s of ${granted[$1]:-?} s) ====="; cat "$work/$1.out" 2>/dev/null; echo; } >> "$out/$2"
}

# What a Python step said went wrong: its FAIL lines, else the end of its output.
python_detail() {  # python_detail STEP
  local f="$work/$1.out"
  { grep -E '^FAIL' "$f" | head -20
    if ! grep -qE '^FAIL' "$f"; then
      if [ "${result[$1]}" = TIMEOUT ]; then
        echo "stopped at its limit of ${granted[$1]} s, in:"
        grep -E -A1 'File ".*tools/gpu_check/' "$f" | tail -2
        echo "..."
      fi
      grep -vE '^(OK:|\s*$)' "$f" | tail -6
    fi
  } > "$work/$1.detail"
}

wanted() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
# Whether step $1 ran and did not pass (a step "not run" keeps its reason as detail).
failed() { case "${result[$1]}" in ok|"not run") return 1 ;; *) return 0 ;; esac; }

skip_rest() {  # marks every step still "not run" with a reason
  local s
  for s in "${steps[@]}"; do
    if [ "${result[$s]}" = "not run" ]; then result[$s]="not run"; note[$s]=$1; echo "$1" > "$work/$s.detail"; fi
  done
}

rm -f "$out"/{summary.md,junit.xml,timings.md,build.log,tests.log,sanitizer.log,checks.log}

# --- the machine ----------------------------------------------------------------------------
{
  echo "===== machine ====="
  nvidia-smi 2>&1 | head -20
  echo "python: $py"; echo "nvcc: $(command -v nvcc || echo none)"; echo "compute-sanitizer: ${sanitizer:-none}"
  echo "ccache: $(command -v ccache || echo none)"; echo "cmake: $(cmake --version 2>/dev/null | head -1)"
} >> "$out/checks.log"
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>/dev/null | head -1)
torch_line=$([ -n "$py" ] && "$py" -c 'import torch, sys; print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), Python {sys.version.split()[0]}, GPU visible to torch: {torch.cuda.is_available()}")' 2>&1 | tail -1)
if [ -n "${CUDAARCHS:-}" ]; then
  arch=$CUDAARCHS
else
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  if [ -z "$cap" ] && [ -n "$py" ]; then
    cap=$("$py" -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())' 2>/dev/null)
  fi
  arch=${cap:+${cap}-real}
fi
header="GPU: ${gpu:-none found by nvidia-smi}; ${torch_line:-no Python with torch ($PYTHON)}; CUDA architectures: ${arch:-unknown}; nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo none); LD_PRELOAD: ${LD_PRELOAD:-none}."
echo "$header" >> "$out/checks.log"

if [ -z "$py" ]; then
  skip_rest "no Python ($PYTHON)"
  exit 1
fi
if [ "$device" = cpu ]; then
  for s in build tests memcheck racecheck synccheck; do
    if wanted "$s"; then result[$s]="not run"; echo "GPU_CHECK_DEVICE=cpu" > "$work/$s.detail"; fi
  done
elif [ -z "$arch" ] || ! "$py" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  skip_rest "no usable GPU: nvidia-smi or torch.cuda finds none"
  exit 1
fi

# --- a. build -----------------------------------------------------------------------------------
if wanted build && [ "$device" = cuda ]; then
  build_dir="build/gpu-${arch//[^0-9a-z]/_}"
  launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  # -lineinfo: source lines in compute-sanitizer's reports (it does not change the code).
  run build TERM bash -c '
    set -e
    cmake -S . -B "$0" -G Ninja -DSPECDEC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$1" \
      -DCMAKE_CUDA_FLAGS=-lineinfo -DPython_EXECUTABLE="$2" "${@:3}"
    cmake --build "$0"
    cp "$0"/_C*.so python/specdec/
    "$2" -c "import specdec; i = specdec.build_info(); print(i); assert i.cuda_kernels, \"no CUDA kernels\""
  ' "$build_dir" "$arch" "$py" "${launcher[@]}"
  note[build]="$(grep -o 'BuildInfo(.*)' "$work/build.out" | tail -1)"
  if failed build; then
    { [ "${result[build]}" = TIMEOUT ] && echo "stopped at its limit of ${granted[build]} s"
      grep -E 'error|Error|FAILED|CMake Error' "$work/build.out" | head -12
      echo "... last lines:"; tail -6 "$work/build.out"; } > "$work/build.detail"
  fi
  keep build build.log
  if [ "${result[build]}" != ok ]; then skip_rest "the build failed"; exit 1; fi
  summarize
fi

# --- b. the tests that run on CUDA --------------------------------------------------------------
if wanted tests && [ "$device" = cuda ]; then
  read -r -a test_paths <<< "${GPU_CHECK_TESTS:-tests/ops tests/model tests/loop tests/proposers}"
  jobs=${GPU_CHECK_TEST_JOBS:-}
  if [ -z "$jobs" ]; then if "$py" -c 'import xdist' 2>/dev/null; then jobs=4; else jobs=1; fi; fi
  xdist=(); [ "$jobs" -gt 1 ] && xdist=(-n "$jobs")
  # tools/gpu_check on the path for the plugin only (its module names are generic).
  run tests INT env PYTHONPATH="$root/tools/gpu_check:$PYTHONPATH" "$py" -m pytest "${test_paths[@]}" --ignore=tests/loop/test_random_configs.py \
    -p cuda_only -p no:cacheprovider -v -rfE --junitxml="$out/junit.xml" "${xdist[@]}"
  f="$work/tests.out"
  note[tests]=$(grep -E '^=+ .*(passed|failed|error|no tests ran|deselected).* in [0-9.]+s' "$f" | tail -1 | tr -d '=' | sed 's/^ *//; s/ *$//')
  if failed tests; then
    { [ "${result[tests]}" = TIMEOUT ] && echo "stopped at its limit of ${granted[tests]} s"
      grep -E '^(FAILED|ERROR) ' "$f" | head -40
      last=$(grep -E '^tests/[^ ]+::' "$f" | tail -1)
      if [ -n "$last" ] && ! grep -qE ' (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)' <<< "$last"; then
        echo "running when stopped: $last"
      fi
      grep -qE '^(FAILED|ERROR) ' "$f" || tail -5 "$f"
      [ -s "$out/junit.xml" ] || echo "(no junit.xml: pytest was killed before writing it)"
    } > "$work/tests.detail"
  fi
  keep tests tests.log
  summarize
fi

# --- c. compute-sanitizer over every kernel -----------------------------------------------------
for tool in memcheck racecheck synccheck; do
  wanted "$tool" && [ "$device" = cuda ] || continue
  if [ -z "$sanitizer" ]; then
    result[$tool]="not run"; echo "compute-sanitizer not found (PATH, next to nvcc)" > "$work/$tool.detail"
    note[$tool]="no compute-sanitizer"
    continue
  fi
  # Without torch's caching allocator every tensor is its own allocation, so memcheck sees an
  # access past a tensor's end instead of landing in a neighbour's memory.
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "$tool" TERM "$sanitizer" --tool "$tool" --error-exitcode 3 \
    --print-limit 20 "$py" tools/gpu_check/kernels_once.py
  f="$work/$tool.out"
  note[$tool]=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -1 | sed 's/^=* *//')
  if failed "$tool"; then
    { [ "${result[$tool]}" = TIMEOUT ] && echo "stopped at its limit of ${granted[$tool]} s"
      # The first reports (what, then where: the kernel and source line), the script's own failures.
      grep -E -A3 '^=+ +(Invalid|Race|Barrier|Error|Program hit|Uninitialized|Misaligned|Warning|Out-of-range|Divergent)' "$f" | head -16
      grep -E '^FAIL' "$f" | head -10
      grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -1
    } > "$work/$tool.detail"
    [ "$(wc -l < "$work/$tool.detail")" -gt 2 ] || { echo "... last lines:"; tail -8 "$f"; } >> "$work/$tool.detail"
  fi
  keep "$tool" sanitizer.log
  summarize
done

# --- d. CUDA graph of a verification step -------------------------------------------------------
if wanted graph; then
  run graph INT "$py" tools/gpu_check/graph_step.py --device "$device"
  note[graph]=$(grep -E '^verification step' "$work/graph.out" | tail -1)
  failed graph && python_detail graph
  keep graph checks.log
  summarize
fi

# --- e. timings ---------------------------------------------------------------------------------
if wanted timings; then
  lim=$(limit_for timings)
  quick=(); [ "$device" = cpu ] && quick=(--quick)
  run timings INT "$py" tools/gpu_check/timings.py --device "$device" "${quick[@]}" --out "$out/timings.md" \
    --budget $((lim > 30 ? lim - 15 : lim / 2))
  note[timings]="timings.md"
  failed timings && python_detail timings
  keep timings checks.log
  summarize
fi

# --- f. an end-to-end decode --------------------------------------------------------------------
if wanted decode; then
  model=(); [ "$device" = cpu ] && model=(--model random)  # the script check: a small model
  run decode INT "$py" tools/gpu_check/decode_e2e.py --device "$device" "${model[@]}"
  note[decode]=$(grep -E '^model:' "$work/decode.out" | tail -1 | cut -c1-160)
  failed decode && python_detail decode
  keep decode checks.log
fi

status=0
for s in "${steps[@]}"; do [ "${result[$s]}" = ok ] || status=1; done
exit $status
