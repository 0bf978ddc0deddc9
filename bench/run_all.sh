#!/usr/bin/env bash
# Every benchmark behind docs/benchmarks.md, one after another (run on a quiet machine).
# Usage: bench/run_all.sh [python]   (default: python; e.g. .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-python}"
out=bench/results
mkdir -p "$out"
for b in ops ngram attention kv_commit; do
  "$py" -m pytest "bench/bench_$b.py" -q --benchmark-json "$out/$b.json" -p no:cacheprovider
  "$py" bench/report.py "$out/$b.json" > "$out/$b.md"
done
for dtype in float32 bfloat16; do
  "$py" bench/pass_cost.py --model qwen2.5-coder-1.5b --dtype "$dtype" --ks 1,2,4,8,16,32
done
"$py" -m specdec.cli bench --model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --prompts 2 --out "$out"
"$py" bench/long_prompt.py --model qwen2.5-coder-0.5b --lengths 500,2000,4000,8000 --repeats 2
"$py" bench/batch_sizes.py --model qwen2.5-coder-0.5b --sizes 1,2,4,8,16 --threads 2
"$py" bench/batch_pass_cost.py --model qwen2.5-coder-0.5b --rows 1,2,4,8,16 --ks 1,2,4,8,16 --threads 2
"$py" bench/shared_prefix.py --model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --draft-dtype bfloat16 --rows 8 --threads 2
