"""Markdown table of a pytest-benchmark JSON whose tests compare `impl` = kernel / reference.

Usage: python bench/report.py bench/results/ops.json [more.json ...]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def table(paths: list[str]) -> str:
    groups: dict[str, dict[str, float]] = defaultdict(dict)
    for path in paths:
        for bench in json.load(open(path))["benchmarks"]:
            groups[bench["group"]][bench["params"]["impl"]] = bench["stats"]["median"] * 1e3
    impls = sorted({impl for g in groups.values() for impl in g}, key=lambda i: i != "kernel")
    lines = ["| case | " + " | ".join(f"{i} (ms)" for i in impls) + " | speed-up |",
             "|---" * (len(impls) + 2) + "|"]
    for group, times in groups.items():
        cells = [f"{times[i]:.3f}" if i in times else "" for i in impls]
        base = [times[i] for i in impls[1:] if i in times]
        speedup = f"{base[0] / times['kernel']:.1f}x" if base and "kernel" in times else ""
        lines.append(f"| {group} | " + " | ".join(cells) + f" | {speedup} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1:]))
