"""kv_commit against reference.py, by hand, and its contracts (SpecCache: test_spec_cache.py)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from support.ops import DEVICES

from specdec import ops
from specdec.ops import reference


def make_caches(L, B, H, S, D, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ks = [torch.randn(B, H, S, D, generator=gen).to(device, dtype) for _ in range(L)]
    vs = [torch.randn(B, H, S, D + 2, generator=gen).to(device, dtype) for _ in range(L)]
    return ks, vs


def commit_case(B, S, A, index_dtype, device, seed=0):
    """Ragged rows; tree-path sources (increasing, src >= destination) that overlap."""
    gen = torch.Generator().manual_seed(seed)
    lengths = (torch.rand(B, generator=gen) * (S - 2 * A)).long()
    accept = (torch.rand(B, generator=gen) * (A + 1)).long()
    src = torch.full((B, A), -1, dtype=torch.int64)
    for b in range(B):
        nodes = torch.sort(torch.randperm(A, generator=gen)[: int(accept[b])]).values
        src[b, : int(accept[b])] = lengths[b] + nodes  # node i of a path: index >= i
    return (t.to(device, index_dtype) for t in (lengths, src, accept))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.float8_e4m3fn])
def test_kv_commit_matches_reference(device, index_dtype, dtype):
    # Entries are copied as opaque elements of 4, 2, 8 and 1 bytes.
    ks, vs = make_caches(3, 4, 2, 40, 8, dtype, device)
    lengths, src, accept = commit_case(4, 40, 7, index_dtype, device)
    ks_ref, vs_ref = [k.clone() for k in ks], [v.clone() for v in vs]
    lengths_ref = lengths.clone()
    ops.kv_commit(ks, vs, lengths, src, accept)
    reference.kv_commit(ks_ref, vs_ref, lengths_ref, src, accept)
    assert torch.equal(lengths, lengths_ref) and lengths.dtype == index_dtype
    for got, want in zip(ks + vs, ks_ref + vs_ref):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("device", DEVICES)
def test_kv_commit_overlap_is_a_gather(device):
    # Sources overlapping destinations: the result equals gathering first, then writing.
    ks, vs = make_caches(2, 2, 3, 16, 4, torch.float32, device)
    lengths = torch.tensor([2, 0], device=device)
    src = torch.tensor([[3, 4, 6, 9], [0, 1, 2, 5]], device=device)
    accept = torch.tensor([4, 4], device=device)
    want = [c.clone() for c in ks + vs]
    for c in want:
        for b in range(2):
            gathered = c[b, :, src[b]].clone()
            c[b, :, int(lengths[b]) : int(lengths[b]) + 4] = gathered
    ops.kv_commit(ks, vs, lengths, src, accept)
    for got, w in zip(ks + vs, want):
        assert torch.equal(got, w)
    assert lengths.tolist() == [6, 4]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_and_compile(device):
    ks, vs = make_caches(2, 3, 2, 20, 4, torch.float32, device)
    lengths, src, accept = commit_case(3, 20, 4, torch.int64, device)
    torch.library.opcheck(torch.ops.specdec.kv_commit.default, (ks, vs, lengths.clone(), src, accept))

    @torch.compile(fullgraph=True)
    def f(ks, vs, lengths, src, accept):
        ops.kv_commit(ks, vs, lengths, src, accept)
        return lengths * 1

    ks_ref, vs_ref, len_ref = [k.clone() for k in ks], [v.clone() for v in vs], lengths.clone()
    reference.kv_commit(ks_ref, vs_ref, len_ref, src, accept)
    assert torch.equal(f(ks, vs, lengths, src, accept), len_ref)
    for got, want in zip(ks + vs, ks_ref + vs_ref):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def bad_calls(ks, vs, lengths, src, n, values: bool):
    """(args, error, match) of kv_commit calls that must raise; ``values``: include the value
    checks, which read the data (CPU tensors only)."""
    cases = [
        (([], [], lengths, src, n), ValueError, "k_caches is empty"),
        ((ks, vs[:1], lengths, src, n), ValueError, "v_caches has 1"),
        (([ks[0], ks[1][:, :1].contiguous()], vs, lengths, src, n), ValueError, "k_caches must have shape"),
        (([ks[0], ks[1].double()], vs, lengths, src, n), TypeError, "k_caches must have the dtype"),
        (([ks[0], ks[1].transpose(0, 1)], vs, lengths, src, n), ValueError, "k_caches must have shape|contiguous"),
        ((ks, vs, lengths.float(), src, n), TypeError, "lengths must be int64 or int32"),
        ((ks, vs, lengths[:1], src, n), ValueError, "lengths must have shape"),
        ((ks, vs, lengths, src.int(), n), TypeError, "src_pos must have the dtype"),
        ((ks, vs, lengths, src[0], n), ValueError, "src_pos must have 2"),
        ((ks, vs, lengths, src, n[:1]), ValueError, "accept_len must have shape"),
    ]
    if values:
        cases += [
            ((ks, vs, lengths, src, torch.tensor([3, 0])), ValueError, r"accept_len\[0\] = 3"),
            ((ks, vs, torch.tensor([9, 0]), src, n), ValueError, r"lengths\[0\] = 9"),
            ((ks, vs, lengths, torch.tensor([[3, 10], [5, 6]]), n), ValueError, r"src_pos\[0, 1\] = 10"),
        ]
    return cases


def test_kv_commit_bad_inputs():
    ks, vs = make_caches(2, 2, 2, 10, 4, torch.float32, "cpu")
    lengths, src, n = torch.tensor([1, 2]), torch.tensor([[3, 4], [5, 6]]), torch.tensor([2, 1])
    for args, exc, match in bad_calls(ks, vs, lengths, src, n, values=True):
        with pytest.raises(exc, match=match):
            ops.kv_commit(*args)
    assert lengths.tolist() == [1, 2]  # nothing written by the failed calls


@pytest.mark.parametrize("device", DEVICES)
def test_fake_kernel_rejects_what_the_kernel_rejects(device):
    # What torch.compile traces with: the same shape, dtype and device errors; correct calls pass.
    mode = FakeTensorMode()
    ks, vs = make_caches(2, 2, 2, 10, 4, torch.float32, device)
    ks, vs = [mode.from_tensor(k) for k in ks], [mode.from_tensor(v) for v in vs]
    lengths, src, n = (mode.from_tensor(torch.tensor(t, device=device)) for t in ([1, 2], [[3, 4], [5, 6]], [2, 1]))
    with mode:
        for args, exc, match in bad_calls(ks, vs, lengths, src, n, values=False):
            with pytest.raises(exc, match=match):
                ops.kv_commit(*args)
        ops.kv_commit(ks, vs, lengths, src, n)
