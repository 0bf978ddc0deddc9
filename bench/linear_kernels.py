"""A few rows through a linear layer: specdec's two float32 layers (``DotLinear`` on
``specdec.ops.linear``, ``PackedLinear`` on oneDNN), torch's ``F.linear`` and, where vLLM is
installed, vLLM's CPU GEMM (``onednn_mm``), on 1 and 2 threads.

A one-token decoding step of a small model is a row through every weight, so it runs at the
speed the weights are read from memory; a verification pass is a few rows. This says which
kernel reads the weights fastest, whether it uses every core, and what 4 and 16 rows cost.
Shapes: Qwen2.5-Coder-0.5B's MLP (4864x896 up, 896x4864 down) and its LM head (151936x896),
fp32. Run it in the vLLM environment to get them all (specdec is installed there):

    LD_PRELOAD=$PWD/.venv-vllm/lib/libiomp5.so .venv-vllm/bin/python bench/linear_kernels.py

Writes ``bench/results/linear_kernels.{json,md}``. Run it on an idle machine: the figures are
wall-clock means.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from specdec.model.prepare import PackingConfig, pack_linear_layers

SHAPES = ((4864, 896), (896, 4864), (151936, 896))
ROWS = (1, 4, 16)


def kernels(weight: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """The ways to multiply rows by ``weight [N, K]``: each returns ``[rows, N]``."""
    out = {}
    for kernel, name in (("specdec", "specdec DotLinear"), ("onednn", "specdec PackedLinear")):
        layer = nn.Sequential(nn.Linear(weight.shape[1], weight.shape[0], bias=False))
        with torch.no_grad():
            layer[0].weight.copy_(weight)
        out[name] = pack_linear_layers(layer, PackingConfig(kernel=kernel))
    out["torch F.linear"] = lambda x: nn.functional.linear(x, weight)
    try:
        from vllm import _custom_ops as ops
    except ImportError:
        return out
    handler = ops.create_onednn_mm(weight.t(), 32)
    out["vLLM onednn_mm"] = lambda x: ops.onednn_mm(handler, x, None)
    return out


def seconds(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, reps: int) -> float:
    f(x)
    f(x)
    start = time.perf_counter()
    for _ in range(reps):
        f(x)
    return (time.perf_counter() - start) / reps


def main() -> None:
    rows = []
    with torch.inference_mode():
        for N, K in SHAPES:
            weight = torch.randn(N, K)
            found = kernels(weight)
            for m in ROWS:
                x = torch.randn(m, K)
                reference = nn.functional.linear(x, weight)
                for name, f in found.items():
                    torch.testing.assert_close(f(x), reference, atol=1e-3, rtol=1e-4)
                    for threads in (1, 2):
                        torch.set_num_threads(threads)
                        s = seconds(f, x, 10 if N > 100_000 else 300)
                        rows.append({"shape": f"{N}x{K}", "rows": m, "kernel": name, "threads": threads,
                                     "ms": round(s * 1e3, 3), "GB_per_s": round(weight.numel() * 4 / s / 1e9, 1)})
    out = Path("bench/results/linear_kernels")
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = ["| shape (fp32) | rows | kernel | threads | ms | weight GB/s |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['shape']} | {r['rows']} | {r['kernel']} | {r['threads']} | {r['ms']} | {r['GB_per_s']} |"
              for r in rows]
    out.with_suffix(".md").write_text(f"{json.dumps(meta)}\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
