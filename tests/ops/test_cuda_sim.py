"""The CUDA simulation itself (docs/cuda_simulation.md): it catches what breaks the CUDA
execution model, and the kernels' size-dependent paths (split counts, grid limits) run in it.
Runs only where the simulation's library is given (tools/cuda_sim.sh)."""

import pytest
import torch
from support import cuda_sim

from specdec import ops
from specdec.ops import reference

pytestmark = pytest.mark.skipif(not cuda_sim.LIBRARY, reason="no CUDA simulation library given")

BLOCKS, THREADS = 3, 64


def self_test(name: str) -> torch.Tensor:
    return torch.ops.specdec_cuda_sim.self_test(name)


def test_barriers_order_shared_memory():
    want = torch.tensor([[1000 * b + (i + 1) % THREADS for i in range(THREADS)] for b in range(BLOCKS)])
    assert torch.equal(self_test("neighbour_read_with_barrier"), want)
    # Without the barrier, the forward, reverse and random orders of the three blocks read stale
    # slots: every block sees some.
    stale = self_test("neighbour_read_without_barrier") != want
    assert stale.any(dim=1).all()


@pytest.mark.parametrize(
    "name, match",
    [
        ("divergent_barrier", r"__syncthreads is not reached by every thread.*threads 0-15: waits"
                              r" at __syncthreads .*self_test.cpp:\d+; threads 16-63: exited"),
        ("barriers_at_two_sites", r"__syncthreads is not reached by every thread"),
        ("half_warp_shuffle", r"a warp shuffle needs all 32 lanes of the warp, but in warp 0 "
                              r"threads 0-15: waits at a shuffle"),
        ("partial_mask_shuffle", r"mask 0xffff \(only the full warp"),
    ],
)
def test_broken_kernels_fail_loudly(name, match):
    with pytest.raises(RuntimeError, match=r"CUDA simulation: block \(0, 0, 0\) of a \(3, 1, 1\) grid"):
        self_test(name)
    with pytest.raises(RuntimeError, match=match):
        self_test(name)


def test_warp_shuffles_and_block_collectives():
    assert (self_test("warp_sum") == sum(range(32))).all()
    reduced = self_test("reduce_poison")
    assert (reduced[:, 0] == sum(range(THREADS))).all()
    assert (reduced[:, 1:] == -1).all()  # CUB defines a reduction in thread 0 only: NaN elsewhere
    scanned = self_test("scan")
    assert torch.equal(scanned, (torch.arange(1, THREADS + 1) * 10000 + THREADS).expand(BLOCKS, -1))


@pytest.fixture
def sm_count():
    """Sets the simulated GPU's SM count for a test, restoring it afterwards."""
    before = torch.ops.specdec_cuda_sim.set_sm_count(132)
    yield torch.ops.specdec_cuda_sim.set_sm_count
    torch.ops.specdec_cuda_sim.set_sm_count(before)


def attention_inputs(B, Hkv, S, T, gen, G=2, D=32):
    q = torch.randn(B, Hkv * G, T, D, generator=gen)
    k = torch.randn(B, Hkv, S, D, generator=gen)
    v = torch.randn(B, Hkv, S, D, generator=gen)
    prefix = torch.randint(0, S - T + 1, (B,), generator=gen)
    return q, k, v, prefix


@pytest.mark.parametrize("sms, S", [(132, 17000), (108, 17000), (6, 2000), (1, 2000)])
def test_attention_splits_follow_the_sm_count(device, sm_count, sms, S):
    # 2 rows x 2 KV heads: 2 * SMs / 4 key splits are wanted, at most one per 256 keys (so 66 and
    # 54 of the possible 67 at 17000 keys, 3 and 1 of the possible 8 at 2000): every split count
    # matches the reference.
    if device != "cuda_sim":
        pytest.skip("the SM count is the simulated GPU's")
    sm_count(sms)
    gen = torch.Generator().manual_seed(0)
    q, k, v, prefix = attention_inputs(2, 2, S, 5, gen)
    got = ops.tree_attention(q, k, v, prefix)
    want = reference.tree_attention(q, k, v, prefix)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_attention_row_bits_depend_on_the_batch_shape_only(device, sm_count):
    # On CUDA a row's key splits, hence its rounding, follow B x Hkv, S and the SM count: with
    # those fixed, a row's output is the same bits whatever the other rows hold (with another
    # batch size it may differ, unlike on the CPU: docs/cuda_simulation.md).
    if device != "cuda_sim":
        pytest.skip("the SM count is the simulated GPU's")
    sm_count(132)
    gen = torch.Generator().manual_seed(1)
    q, k, v, prefix = attention_inputs(3, 2, 1500, 4, gen)
    first = ops.tree_attention(q, k, v, prefix)
    q2, k2, v2, prefix2 = attention_inputs(3, 2, 1500, 4, gen)
    for t, t2 in ((q, q2), (k, k2), (v, v2)):
        t2[1] = t[1]
    prefix2[1] = prefix[1]
    second = ops.tree_attention(q2, k2, v2, prefix2)
    assert torch.equal(first[1], second[1])


def test_launch_beyond_the_grid_limits_raises(device, sm_count):
    # 1048577 query rows per KV head need 65537 tiles of 16 rows: more than a grid's 65535.
    if device != "cuda_sim":
        pytest.skip("the limit is the CUDA kernel's")
    sm_count(1)  # 2 key splits: small partial buffers
    T = 65537 * 16 - 15
    q = torch.zeros(1, 1, T, 1)
    k = torch.zeros(1, 1, T, 1)
    with pytest.raises(ValueError, match=r"tree_attention: the inputs need a grid of \(1, 2, 65537\) blocks"):
        ops.tree_attention(q, k, k, torch.zeros(1, dtype=torch.long))
