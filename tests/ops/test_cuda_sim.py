"""The CUDA simulation itself (docs/cuda_simulation.md): it catches what breaks the CUDA
execution model, and the kernels' size-dependent paths (split counts, grid limits) run in it.
Runs only where the simulation's library is given (tools/cuda_sim.sh)."""

import pytest
import torch
from support import cuda_sim
from support.ops import random_parents

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
        ("divergent_barrier", (r"__syncthreads is not reached by every thread.*threads 0-15: waits"
                               r" at __syncthreads .*self_test.cpp:\d+; threads 16-63: exited")),
        ("barriers_at_two_sites", r"__syncthreads is not reached by every thread"),
        ("half_warp_shuffle", (r"a warp shuffle needs all 32 lanes of the warp, but in warp 0 "
                               r"threads 0-15: waits at a warp shuffle .*self_test.cpp:\d+; threads 16-31: exited")),
        ("partial_mask_shuffle", r"mask 0xffff \(only the full warp"),
    ],
)
def test_broken_kernels_fail_loudly(name, match):
    with pytest.raises(RuntimeError, match=r"CUDA simulation: block \(0, 0, 0\) of a \(3, 1, 1\) grid"):
        self_test(name)
    with pytest.raises(RuntimeError, match=match):
        self_test(name)


def wmma_self_test(name: str) -> torch.Tensor:
    return torch.ops.specdec_cuda_sim.wmma_self_test(name)


@pytest.mark.parametrize(
    "name, match",
    [
        ("wmma_half_warp", (r"wmma::fill_fragment needs all 32 lanes of the warp, but in warp 0 threads "
                            r"0-15: waits at wmma::fill_fragment .*self_test_wmma.cpp:\d+; threads 16-31: exited")),
        ("wmma_lanes_disagree", r"wmma::load_matrix_sync at .* in warp 0: lane 1 passes another pointer"),
        ("wmma_misaligned", r"wmma::load_matrix_sync at .*: the address is not 32-byte aligned"),
        ("wmma_bad_ldm", r"the leading dimension 6 is not a multiple of 4 elements"),
        ("wmma_fill_differs", r"lane 1 fills another value than lane 0"),
        ("syncwarp_half", r"__syncwarp needs all 32 lanes of the warp, but in warp 0 threads 0-15"),
        ("misaligned_vector_load", r"a 16-byte vector load: the address is not 16-byte aligned"),
    ],
)
def test_broken_warp_primitives_fail_loudly(name, match):
    with pytest.raises(RuntimeError, match=r"CUDA simulation: block \(0, 0, 0\) of a \(3, 1, 1\) grid.*" + match):
        wmma_self_test(name)


def test_wmma_mapping_is_scrambled_and_elementwise_operations_work():
    # Lane l's first accumulator element: a permutation nothing may rely on (not the row-major
    # order of any GPU's layout: lane 0 would hold entry 0, lanes 0-3 row 0, ...).
    first = wmma_self_test("wmma_positions")
    assert torch.equal(first[:, :32], first[:, 32:]) and torch.equal(first[0], first[1])
    lanes = first[0, :32]
    assert len(set(lanes.tolist())) == 32
    assert not torch.equal(lanes // 16, torch.arange(32) // 4)
    assert not torch.equal(lanes.sort().values, lanes)
    # Element-wise with a fragment of row indices (tree_attention's rescaling): row r times r + 1.
    scaled = wmma_self_test("wmma_row_scale")
    assert torch.equal(scaled, ((torch.arange(THREADS) % 16 + 1) * 16).expand(BLOCKS, -1))


def test_async_copies_land_at_the_wait():
    def run(name):
        return torch.ops.specdec_cuda_sim.async_self_test(name)

    want = torch.tensor([[1000 * (b + 1) + (i + 1) % THREADS for i in range(THREADS)] for b in range(BLOCKS)])
    assert torch.equal(run("copy_waited"), want)
    # Without the wait, copies land only after the reads in some orders: every block reads stale slots.
    assert (run("copy_not_waited") != want).any(dim=1).all()
    assert (run("wait_prior_one") == 10).all()  # the older group only
    with pytest.raises(RuntimeError, match="__pipeline_memcpy_async's destination: the address is not 16-byte aligned"):
        run("misaligned_copy")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("b_col_major", [False, True])
def test_wmma_mma_is_a_product(dtype, b_col_major):
    gen = torch.Generator().manual_seed(5)
    a, b = (torch.randn(16, 16, generator=gen).to(dtype) for _ in range(2))
    c = torch.randn(16, 16, generator=gen)
    got = torch.ops.specdec_cuda_sim.wmma_mma(a, b, c, b_col_major)
    torch.testing.assert_close(got, a.double() @ b.double() + c.double(), atol=1e-5, rtol=1e-6, check_dtype=False)


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
    # 2 rows x 2 KV heads: 2 * SMs / 4 key splits are wanted, at most one per 128 keys (so 66 and
    # 54 of the possible 133 at 17000 keys, 3 and 1 of the possible 16 at 2000): every split count
    # matches the reference.
    if device != "cuda_sim":
        pytest.skip("the SM count is the simulated GPU's")
    sm_count(sms)
    gen = torch.Generator().manual_seed(0)
    q, k, v, prefix = attention_inputs(2, 2, S, 5, gen)
    got = ops.tree_attention(q, k, v, prefix)
    want = reference.tree_attention(q, k, v, prefix)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("T", [1, 16, 17, 64])
@pytest.mark.parametrize("G, sms, chain", [(1, 132, False), (4, 1, True), (7, 132, True), (4, 132, False)])
def test_attention_tiles_match_the_reference(device, sm_count, dtype, T, G, sms, chain):
    # Query tiles of 1-4 warps (T x G rows: one partial warp up to several full blocks), key tiles
    # over ragged prefixes that are no multiple of a key tile, with key splits (132 SMs: 3 splits)
    # and without (1 SM), tensor cores (half, bfloat16) and plain fp32, chain and tree masks.
    if device != "cuda_sim":
        pytest.skip("the SM count is the simulated GPU's")
    sm_count(sms)
    gen = torch.Generator().manual_seed(100 * T + G)
    B, Hkv, D, P = 2, 2, 64, 533
    q = torch.randn(B, Hkv * G, T, D, generator=gen).to(dtype)
    k, v = (torch.randn(B, Hkv, P + T, D, generator=gen).to(dtype) for _ in range(2))
    prefix = torch.tensor([P, 250])
    mask = None
    if not chain:
        mask = ops.build_tree(torch.tensor([random_parents(T, gen) for _ in range(B)]))[0]
    got = ops.tree_attention(q, k, v, prefix, mask)
    want = reference.tree_attention(q.float(), k.float(), v.float(), prefix, mask)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    else:
        assert float((got.float() - want).norm() / want.norm()) < 1e-2


def test_attention_head_size_limit(device):
    if device != "cuda_sim":
        pytest.skip("the limit is the CUDA kernel's")
    q = torch.zeros(1, 1, 1, 257)
    with pytest.raises(ValueError, match="head size 257 is too large for the CUDA kernel"):
        ops.tree_attention(q, q, q, torch.zeros(1, dtype=torch.long))


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
    # 4194305 query rows per KV head need 65537 tiles of 64 rows: more than a grid's 65535.
    if device != "cuda_sim":
        pytest.skip("the limit is the CUDA kernel's")
    sm_count(1)  # 2 key splits: small partial buffers
    T = 65536 * 64 + 1
    q = torch.zeros(1, 1, T, 1)
    k = torch.zeros(1, 1, T, 1)
    with pytest.raises(ValueError, match=r"tree_attention: the inputs need a grid of \(1, 65537, 2\) blocks"):
        ops.tree_attention(q, k, k, torch.zeros(1, dtype=torch.long))
