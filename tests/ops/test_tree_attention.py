"""tree_attention against scaled_dot_product_attention with an explicit mask and reference.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from support.ops import DEVICES, random_parents

from specdec import ops
from specdec.ops import reference


def sdpa_tree(q, k, v, prefix_len, tree_mask, scale=None):
    """F.scaled_dot_product_attention in float32 with the explicit [B, 1, T, S] boolean mask."""
    B, H, T, D = q.shape
    S = k.shape[2]
    mask = torch.zeros(B, 1, T, S, dtype=torch.bool, device=q.device)
    for b in range(B):
        p = int(prefix_len[b])
        mask[b, 0, :, :p] = True
        mask[b, 0, :, p : p + T] = tree_mask[b]
    return F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask, scale=scale, enable_gqa=True
    )


def make_inputs(B, H, Hkv, T, D, S, dtype, device, seed=0, index_dtype=torch.int64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=gen).to(device, dtype)
    k = torch.randn(B, Hkv, S, D, generator=gen).to(device, dtype)
    v = torch.randn(B, Hkv, S, D, generator=gen).to(device, dtype)
    prefix_len = (torch.rand(B, generator=gen) * (S - T + 1)).long().to(device, index_dtype)
    parents = torch.tensor([random_parents(T, gen) for _ in range(B)])
    mask, _, _ = ops.build_tree(parents.to(device))
    return q, k, v, prefix_len, mask


SHAPES = [  # B, H, Hkv, T, D, S
    (3, 12, 2, 1, 128, 300),    # decode, Qwen2.5-1.5B heads, ragged prefixes
    (2, 12, 2, 8, 128, 200),
    (2, 6, 2, 128, 64, 400),    # a big tree: the many-rows path
    (2, 4, 4, 17, 80, 90),      # MHA, head size not a multiple of 16
    (1, 2, 1, 5, 8, 5),         # no room for a prefix
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_fp32_matches_sdpa(device, shape, index_dtype):
    q, k, v, prefix_len, mask = make_inputs(*shape, torch.float32, device, index_dtype=index_dtype)
    out = ops.tree_attention(q, k, v, prefix_len, mask)
    torch.testing.assert_close(out, sdpa_tree(q, k, v, prefix_len, mask), atol=1e-5, rtol=0)
    torch.testing.assert_close(out, reference.tree_attention(q, k, v, prefix_len, mask), atol=1e-5, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES[:3])
def test_half_precision_relative_error(device, dtype, shape):
    q, k, v, prefix_len, mask = make_inputs(*shape, dtype, device, seed=1)
    out = ops.tree_attention(q, k, v, prefix_len, mask)
    assert out.dtype == dtype
    ref = sdpa_tree(q, k, v, prefix_len, mask)
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("D", [8, 80, 200, 256])
def test_head_sizes(device, dtype, D):
    # On CUDA: heads padded to 16-column slices, in buckets of up to 64, 128 and 256 channels.
    q, k, v, prefix_len, mask = make_inputs(2, 4, 2, 9, D, 70, dtype, device, seed=6)
    out = ops.tree_attention(q, k, v, prefix_len, mask)
    ref = sdpa_tree(q, k, v, prefix_len, mask)
    if dtype == torch.float16:
        assert float((out.float() - ref).norm() / ref.norm()) < 1e-2
    else:
        torch.testing.assert_close(out.float(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_unaligned_cache_views(device, dtype):
    # Rows of D + 1 elements, the first skipped: no 16-byte loads on CUDA.
    q, k, v, prefix_len, mask = make_inputs(2, 4, 2, 6, 32, 64, dtype, device, seed=7)
    big_k, big_v = (torch.zeros(2, 2, 64, 33, dtype=dtype, device=device) for _ in range(2))
    big_k[..., 1:] = k
    big_v[..., 1:] = v
    out = ops.tree_attention(q, big_k[..., 1:], big_v[..., 1:], prefix_len, mask)
    ref = sdpa_tree(q, k, v, prefix_len, mask)
    assert float((out.float() - ref).norm() / ref.norm()) < (1e-2 if dtype == torch.bfloat16 else 1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_query_gets_the_same_bits_whatever_shares_its_pass(device, dtype):
    # Exactness in every dtype rests on this: node i of a chain of T nodes gets, bit for bit, what
    # a one-token pass gets once nodes 0 .. i-1 are committed, for T up to 64 (on a GPU the prefix
    # spans several key splits, whose number must not depend on T).
    P, T = 600, 64
    q, k, v, _, _ = make_inputs(1, 8, 2, T, 64, P + T, dtype, device, seed=3)
    for size in (1, 2, 3, 4, 8, 17, 64):
        chain = torch.ones(1, size, size, dtype=torch.bool, device=device).tril()
        out = ops.tree_attention(q[:, :, :size], k, v, torch.tensor([P], device=device), chain)
        for i in range(size):
            one = ops.tree_attention(q[:, :, i: i + 1], k, v, torch.tensor([P + i], device=device), chain[:, :1, :1])
            assert torch.equal(out[:, :, i], one[:, :, 0]), (size, i)


@pytest.mark.parametrize("device", DEVICES)
def test_causal_is_the_chain_mask(device):
    q, k, v, prefix_len, _ = make_inputs(2, 8, 2, 37, 64, 160, torch.float32, device, seed=2)
    chain = torch.ones(2, 37, 37, dtype=torch.bool, device=device).tril()
    torch.testing.assert_close(
        ops.tree_attention(q, k, v, prefix_len), ops.tree_attention(q, k, v, prefix_len, chain),
        atol=1e-6, rtol=0,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_long_causal_prefill_and_scale(device):
    # More rows than one CPU task takes, several key blocks, a custom scale.
    q, k, v, _, _ = make_inputs(1, 4, 2, 300, 32, 300, torch.float32, device, seed=3)
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    out = ops.tree_attention(q, k, v, zero, None, 0.3)
    chain = torch.ones(1, 300, 300, dtype=torch.bool, device=device).tril()
    torch.testing.assert_close(out, sdpa_tree(q, k, v, zero, chain, scale=0.3), atol=1e-5, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_cache_views_and_empty_rows(device):
    q, k, v, prefix_len, mask = make_inputs(2, 4, 2, 6, 32, 64, torch.float32, device, seed=4)
    big_k = torch.randn(2, 3, 80, 32, device=device)
    big_v = torch.randn(2, 3, 80, 32, device=device)
    big_k[:, :2, :64] = k
    big_v[:, :2, :64] = v
    mask[0, 3] = False  # a query that sees only the prefix
    prefix_len[1] = 0
    mask[1, 4] = False  # a query that sees nothing: zeros
    out = ops.tree_attention(q, big_k[:, :2, :64], big_v[:, :2, :64], prefix_len, mask)
    torch.testing.assert_close(out, reference.tree_attention(q, k, v, prefix_len, mask), atol=1e-5, rtol=0)
    assert torch.all(out[1, :, 4] == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    q, k, v, prefix_len, mask = make_inputs(2, 4, 2, 5, 16, 20, torch.float32, device)
    out = torch.empty_like(q)
    torch.library.opcheck(
        torch.ops.specdec.tree_attention.default, (q, k, v, prefix_len, mask, None), {"out": out}
    )
    torch.library.opcheck(
        torch.ops.specdec.tree_attention.default, (q, k, v, prefix_len, None, 0.5), {"out": out}
    )


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    q, k, v, prefix_len, mask = make_inputs(2, 4, 2, 5, 16, 20, torch.float32, device)

    @torch.compile(fullgraph=True)
    def f(q, k, v, prefix_len, mask):
        return ops.tree_attention(q * 2, k, v, prefix_len, mask) + 1

    torch.testing.assert_close(f(q, k, v, prefix_len, mask), ops.tree_attention(q * 2, k, v, prefix_len, mask) + 1)


def bad_calls(q, k, v, prefix_len, mask, values: bool):
    """(args, error, match) of tree_attention calls that must raise; ``values``: include the
    value checks, which read the data (CPU tensors only)."""
    cases = [
        ((q[0], k, v, prefix_len, mask), ValueError, "q must have 4"),
        ((q.long(), k, v, prefix_len, mask), TypeError, "q must be float32, float16, bfloat16 or float64"),
        ((q, k.double(), v, prefix_len, mask), TypeError, "k_cache must have the dtype"),
        ((q, k[:, :, :, :8], v, prefix_len, mask), ValueError, "k_cache must have shape"),
        ((q, k, v[:, :1], prefix_len, mask), ValueError, "v_cache must have shape"),
        ((q[:, :3], k, v, prefix_len, mask), ValueError, "multiple of the 2 heads of k_cache"),
        ((q, k[:, :, :4], v[:, :, :4], prefix_len, mask), ValueError, "k_cache holds 4"),
        ((q, k.transpose(2, 3).contiguous().transpose(2, 3), v, prefix_len, mask), ValueError, "k_cache must be contiguous in its last"),
        ((q, k, v, prefix_len.float(), mask), TypeError, "prefix_len must be int64 or int32"),
        ((q, k, v, prefix_len[:1], mask), ValueError, "prefix_len must have shape"),
        ((q, k, v, prefix_len, mask.int()), TypeError, "tree_mask must be bool"),
        ((q, k, v, prefix_len, mask[:, :4]), ValueError, "tree_mask must have shape"),
    ]
    if values:
        cases += [
            ((q, k, v, torch.tensor([0, 16]), mask), ValueError, r"prefix_len\[1\] = 16"),
            ((q, k, v, torch.tensor([-1, 0]), mask), ValueError, r"prefix_len\[0\] = -1"),
        ]
    return cases


def assert_bad_calls_raise(q, k, v, prefix_len, mask, values: bool):
    for args, exc, match in bad_calls(q, k, v, prefix_len, mask, values):
        with pytest.raises(exc, match=match):
            ops.tree_attention(*args)
    with pytest.raises(ValueError, match="output out must have shape"):
        torch.ops.specdec.tree_attention(q, k, v, prefix_len, mask, out=q.new_empty(2, 4, 5, 8))
    with pytest.raises(TypeError, match="output out must be"):
        torch.ops.specdec.tree_attention(q, k, v, prefix_len, mask, out=torch.empty_like(q).double())


def test_bad_inputs():
    assert_bad_calls_raise(*make_inputs(2, 4, 2, 5, 16, 20, torch.float32, "cpu"), values=True)


@pytest.mark.parametrize("device", DEVICES)
def test_fake_kernel_rejects_what_the_kernel_rejects(device):
    # What torch.compile traces with: the same shape, dtype and device errors; correct calls pass.
    mode = FakeTensorMode()
    inputs = [mode.from_tensor(t) for t in make_inputs(2, 4, 2, 5, 16, 20, torch.float32, device)]
    with mode:
        assert_bad_calls_raise(*inputs, values=False)
        assert ops.tree_attention(*inputs).shape == (2, 4, 5, 16)
