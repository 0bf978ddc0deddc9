"""Line coverage of csrc/cuda from a CUDA-simulation build compiled with gcov instrumentation
(tools/cuda_sim.sh). Usage: python tools/cuda_sim_coverage.py BUILD_DIR

Merges gcov's per-translation-unit counts (a header counts once; a line is executed when any
template instance ran it), prints each file's figures and every line never executed, and ends
with the line `csrc/cuda lines executed: N of M (P%)`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUDA_DIR = ROOT / "csrc" / "cuda"


def line_counts(build: Path) -> dict[Path, dict[int, int]]:
    counts: dict[Path, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    gcdas = sorted(build.rglob("*.gcda"))
    if not gcdas:
        sys.exit(f"no .gcda files under {build}: build with SPECDEC_CUDA_SIM_COVERAGE=ON and "
                 "run the tests")
    out = subprocess.run(["gcov", "--json-format", "--stdout", *map(str, gcdas)], cwd=build,
                         capture_output=True, text=True, check=True).stdout
    for doc in out.splitlines():
        for f in json.loads(doc)["files"]:
            path = Path(f["file"])
            path = (path if path.is_absolute() else build / path).resolve()
            if CUDA_DIR not in path.parents:
                continue
            for line in f["lines"]:
                counts[path][line["line_number"]] += line["count"]
    return counts


def main() -> None:
    counts = line_counts(Path(sys.argv[1]).resolve())
    total = executed = 0
    for path in sorted(counts):
        lines = counts[path]
        missed = sorted(n for n, c in lines.items() if c == 0)
        total += len(lines)
        executed += len(lines) - len(missed)
        rel = path.relative_to(ROOT)
        print(f"{rel}: {len(lines) - len(missed)} of {len(lines)} lines executed")
        text = path.read_text().splitlines()
        for n in missed:
            print(f"  not executed: {rel}:{n}: {text[n - 1].strip()}")
    pct = 100.0 * executed / total if total else 0.0
    print(f"csrc/cuda lines executed: {executed} of {total} ({pct:.1f}%)")


if __name__ == "__main__":
    main()
