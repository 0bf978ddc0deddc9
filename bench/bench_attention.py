"""tree_attention vs scaled_dot_product_attention with the explicit boolean mask it replaces.

Qwen2.5-1.5B attention shapes (H=12, Hkv=2, D=128), one row, a committed prefix of 512-4096
positions and a tree of T = 1, 8, 64 nodes. Both read the same cache; SDPA gets the
[1, 1, T, prefix + T] mask (prefix visible, tree ancestors) and its own GQA.

Run: ``python -m pytest bench/bench_attention.py --benchmark-json bench/results/attention.json``
then ``python bench/report.py bench/results/attention.json``.
"""

import pytest
import torch
import torch.nn.functional as F
from support import random_parents

from specdec import ops

H, HKV, D = 12, 2, 128


def inputs(prefix: int, T: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, H, T, D, generator=gen).to(dtype)
    k = torch.randn(1, HKV, prefix + T, D, generator=gen).to(dtype)
    v = torch.randn(1, HKV, prefix + T, D, generator=gen).to(dtype)
    tree_mask, _, _ = ops.build_tree(torch.tensor([random_parents(T, gen)]))
    mask = torch.ones(1, 1, T, prefix + T, dtype=torch.bool)
    mask[0, 0, :, prefix:] = tree_mask[0]
    return q, k, v, torch.tensor([prefix]), tree_mask, mask


@pytest.mark.parametrize("impl", ["kernel", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T", [1, 8, 64])
@pytest.mark.parametrize("prefix", [512, 4096])
def test_tree_attention(benchmark, impl, dtype, T, prefix):
    benchmark.group = f"tree_attention {str(dtype)[6:]} prefix={prefix} T={T}"
    q, k, v, prefix_len, tree_mask, mask = inputs(prefix, T, dtype)
    if impl == "kernel":
        fn = lambda: ops.tree_attention(q, k, v, prefix_len, tree_mask)  # noqa: E731
    else:
        fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # noqa: E731
    benchmark.pedantic(fn, rounds=20, iterations=1, warmup_rounds=2)
