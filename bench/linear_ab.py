"""Two versions of the CPU linear kernel (csrc/cpu/linear_kernel.h) in one process: the one at a
git revision against the working tree, on weights streamed from memory, interleaved.

The kernel's speed on this kind of machine drifts up to 25% between runs, more than most
changes to it gain or lose; timing the two builds in turns within one process cancels the drift
that separate processes cannot. Both versions are compiled from source for the chosen
instruction set (as CMakeLists.txt compiles linear_kernel.h), each in its own namespace, and
must give the same bits for every row count (the kernel's row invariance); the weights are 40
distinct [N, K] matrices (about 700 MB in float32), so every product reads its weight from
memory, as a decoding step of a model larger than the caches does:

    .venv/bin/python bench/linear_ab.py --base HEAD --dtype float32
    .venv/bin/python bench/linear_ab.py --base HEAD~3 --dtype bfloat16 --isa avx2

Prints a table: per row count, the median ms per product of each version, its ratio to its own
one-row product, and new / base. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "csrc/cpu/linear_kernel.h"
ISA_FLAGS = {  # as CMakeLists.txt compiles linear_avx2.cpp / linear_avx512*.cpp
    "avx2": ["-mavx2", "-mfma"],
    "avx512": ["-mavx512f", "-mavx2", "-mfma"],
    "avx512bf16": ["-mavx512bf16", "-mavx512f", "-mavx2", "-mfma"],
}
SHIM = """#include <torch/extension.h>
#include "cpu/linear_args.h"
namespace specdec::cpu {
namespace base_version { void linear(const LinearArgs&); }
namespace new_version { void linear(const LinearArgs&); }
}
void linear(bool use_new, torch::Tensor x, torch::Tensor w, torch::Tensor y) {
  const specdec::cpu::LinearArgs a{x.data_ptr(), w.data_ptr(), nullptr, y.data_ptr(), x.size(0),
                                   w.size(0), w.size(1), x.stride(0), y.stride(0), x.scalar_type()};
  use_new ? specdec::cpu::new_version::linear(a) : specdec::cpu::base_version::linear(a);
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("linear", &linear); }
"""


def build(base: str, isa: str, workdir: Path):
    """Compiles the kernel at ``base`` and the working tree's into one extension."""
    header = subprocess.run(["git", "show", f"{base}:{KERNEL}"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    (workdir / "base_kernel.h").write_text(header)
    (workdir / "new_kernel.h").write_text((ROOT / KERNEL).read_text())
    for version in ("base", "new"):
        (workdir / f"{version}.cpp").write_text(
            f'#define SPECDEC_CPU_ISA {version}_version\n#include "{version}_kernel.h"\n')
    (workdir / "shim.cpp").write_text(SHIM)
    flags = ["-O3", "-fopenmp", "-fno-trapping-math", "-ffp-contract=off", "-Wno-psabi", *ISA_FLAGS[isa]]
    return load(f"linear_ab_{isa}", [str(workdir / f) for f in ("shim.cpp", "base.cpp", "new.cpp")],
                extra_cflags=flags, extra_ldflags=["-fopenmp"], build_directory=str(workdir),
                extra_include_paths=[str(ROOT / "csrc"), str(workdir)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="git revision of the base version")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--isa", choices=tuple(ISA_FLAGS), default="avx512bf16")
    parser.add_argument("--shape", type=int, nargs=2, default=(4864, 896), metavar=("N", "K"))
    parser.add_argument("--rows", type=int, nargs="+", default=(1, 2, 3, 4, 6, 8, 9, 12, 16, 24, 32))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    rows = sorted(set(args.rows) | {1})
    with tempfile.TemporaryDirectory() as tmp:
        ext = build(args.base, args.isa, Path(tmp))
    weights = [torch.randn(*args.shape).to(dtype) for _ in range(40)]

    def product_ms(use_new: bool, x: torch.Tensor, y: torch.Tensor) -> float:
        start = time.perf_counter()
        for w in weights:
            ext.linear(use_new, x, w, y)
        return (time.perf_counter() - start) / len(weights) * 1e3

    times = {(use_new, m): [] for use_new in (False, True) for m in rows}
    for _ in range(args.rounds):
        for m in rows:
            x, y = torch.randn(m, args.shape[1]).to(dtype), torch.empty(m, args.shape[0], dtype=dtype)
            ext.linear(False, x, weights[0], y)
            y_new = torch.empty_like(y)
            ext.linear(True, x, weights[0], y_new)
            if not torch.equal(y, y_new):
                raise SystemExit(f"the two versions give different bits for {m} rows")
            for use_new in (False, True, True, False):
                times[use_new, m].append(product_ms(use_new, x, y))
    median = {key: statistics.median(v) for key, v in times.items()}
    print(f"{args.base} (base) against the working tree (new): {args.dtype}, {args.isa}, "
          f"{args.shape[0]}x{args.shape[1]}, {args.threads} threads, {args.rounds} rounds, medians")
    print("| rows | base ms | base / its 1 row | new ms | new / its 1 row | new / base |")
    print("|---|---|---|---|---|---|")
    for m in rows:
        b, n = median[False, m], median[True, m]
        print(f"| {m} | {b:.3f} | {b / median[False, 1]:.2f} | {n:.3f} | {n / median[True, 1]:.2f} | {n / b:.3f} |")


if __name__ == "__main__":
    main()
