"""kv_commit (every layer in one call) vs a per-layer index_select + copy of the same entries.

Qwen2.5-1.5B caches: 28 layers of [B, 2, 4096, 128], rows with 2000 committed positions that
accept 1-8 tree nodes (A = 8 source positions per row).

Run: ``python -m pytest bench/bench_kv_commit.py --benchmark-json bench/results/kv_commit.json``
then ``python bench/report.py bench/results/kv_commit.json``.
"""

import pytest
import torch

from specdec import ops

LAYERS, HKV, S, D, A, PREFIX = 28, 2, 4096, 128, 8, 2000


def inputs(B: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(0)
    ks = [torch.zeros(B, HKV, S, D, dtype=dtype) for _ in range(LAYERS)]
    vs = [torch.zeros(B, HKV, S, D, dtype=dtype) for _ in range(LAYERS)]
    lengths = torch.full((B,), PREFIX)
    accept = torch.randint(1, A + 1, (B,), generator=gen)
    src = lengths[:, None] + torch.sort(torch.randperm(4 * A, generator=gen)[:A]).values
    return ks, vs, lengths, src, accept


def index_copy_commit(ks, vs, lengths, src, accept):
    """What a decoder does without the op: per layer, gather then write (rows ragged)."""
    B = lengths.shape[0]
    cols = torch.arange(src.shape[1])
    keep = cols < accept[:, None]
    rows = torch.arange(B)[:, None].expand_as(src)[keep]
    dst = (lengths[:, None] + cols)[keep]
    from_ = src[keep]
    for cache in [*ks, *vs]:
        cache[rows, :, dst] = cache[rows, :, from_]
    lengths += accept


@pytest.mark.parametrize("impl", ["kernel", "index_copy"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("B", [1, 8])
def test_kv_commit(benchmark, impl, dtype, B):
    benchmark.group = f"kv_commit {LAYERS} layers {str(dtype)[6:]} B={B} A={A}"
    ks, vs, lengths, src, accept = inputs(B, dtype)
    fn = ops.kv_commit if impl == "kernel" else index_copy_commit

    def step():
        fn(ks, vs, lengths, src, accept)
        lengths.fill_(PREFIX)  # the same work every round

    benchmark.pedantic(step, rounds=20, iterations=1, warmup_rounds=2)
