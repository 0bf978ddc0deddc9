"""chain_speculative_sampling and chain_greedy_verify against the reference, and by hand."""

import pytest
import torch
from support.ops import assert_draws_match, drafts_from, random_probs

import specdec.ops.reference as ref
from specdec import ops

INDEX_DTYPES = [torch.int64, torch.int32]


def assert_matches_reference(got, want, device):
    (out, n), (want_out, want_n) = got, want
    assert torch.equal(n.cpu(), want_n)
    out = out.cpu()
    drawn = torch.zeros_like(out, dtype=torch.bool)
    drawn[torch.arange(out.shape[0]), want_n.long()] = True
    assert torch.equal(out[~drawn], want_out[~drawn])  # accepted drafts and -1 padding
    assert_draws_match(out[drawn], want_out[drawn], device)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("B,K,V", [(1, 1, 7), (3, 4, 50), (16, 8, 1000), (64, 5, 300), (2, 6, 152064)])
@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_chain_sampling_matches_reference(device, index_dtype, B, K, V, with_draft_probs):
    gen = torch.Generator().manual_seed(B * 1000 + K * 10 + V)
    q = random_probs(B, K, V, gen=gen)
    p = random_probs(B, K + 1, V, gen=gen)
    # Half of the drafts come from p itself, so rows accept many and various lengths.
    ids = torch.where(torch.rand(B, K, generator=gen) < 0.5, drafts_from(p[:, :K], gen), drafts_from(q, gen))
    ids = ids.to(index_dtype)
    u = torch.rand(B, K + 1, generator=gen)
    draft = q if with_draft_probs else None
    want = ref.chain_speculative_sampling(draft, ids, p, u)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    got = ops.chain_speculative_sampling(to(draft), to(ids), to(p), to(u))
    assert_matches_reference(got, want, device)


def test_chain_sampling_draws_from_a_vocabulary_beyond_1024_chunks(device):
    # Above 1024 chunks of 512 (V > 524288) a CUDA draw's chunks hold several 512-token steps
    # (docs/cuda_kernels.md). Every draft is rejected (p(x) < u), so every row draws.
    gen = torch.Generator().manual_seed(4)
    B, V = 8, 600_000
    p = torch.rand(B, 2, V, generator=gen)
    p /= p.sum(-1, keepdim=True)
    ids = torch.randint(0, V, (B, 1), generator=gen)
    u = torch.stack([torch.ones(B), torch.rand(B, generator=gen)], 1)
    want = ref.chain_speculative_sampling(None, ids, p, u)
    got = ops.chain_speculative_sampling(None, ids.to(device), p.to(device), u.to(device))
    assert_matches_reference(got, want, device)


def test_chain_sampling_by_hand(device):
    # Row 0: p puts everything on the drafts: all accepted, bonus from p_K (token 3).
    # Row 1: the second draft has p = 0: rejected; the token is drawn from p_1 without it.
    p = torch.tensor(
        [
            [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]],
            [[0.0, 1.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.5], [1.0, 0.0, 0.0, 0.0]],
        ],
        device=device,
    )
    ids = torch.tensor([[1, 2], [1, 2]], device=device)
    u = torch.tensor([[0.9, 0.9, 0.2], [0.9, 0.1, 0.7]], device=device)
    out, n = ops.chain_speculative_sampling(None, ids, p, u)
    assert out.tolist() == [[1, 2, 3], [1, 3, -1]]  # u = 0.7 of [0.5, 0, 0, 0.5] -> token 3
    assert n.tolist() == [2, 1]


def test_chain_sampling_one_hot_targets_accept_everything(device):
    gen = torch.Generator().manual_seed(0)
    B, K, V = 8, 6, 100
    ids = torch.randint(0, V, (B, K), generator=gen)
    bonus = torch.randint(0, V, (B,), generator=gen)
    tokens = torch.cat([ids, bonus[:, None]], 1)
    p = torch.nn.functional.one_hot(tokens, V).float()
    q = random_probs(B, K, V, gen=gen, sparsity=0.0)
    u = torch.rand(B, K + 1, generator=gen)
    for draft in (None, q):
        args = [t if t is None else t.to(device) for t in (draft, ids, p, u)]
        out, n = ops.chain_speculative_sampling(*args)
        assert n.tolist() == [K] * B
        assert torch.equal(out.cpu(), tokens)


def test_chain_sampling_never_emits_zero_probability(device):
    gen = torch.Generator().manual_seed(1)
    B, K, V = 256, 3, 20
    p = random_probs(B, K + 1, V, gen=gen, sparsity=0.6)
    q = random_probs(B, K, V, gen=gen)
    ids = drafts_from(q, gen)
    u = torch.rand(B, K + 1, generator=gen)
    for draft in (None, q):
        args = [t if t is None else t.to(device) for t in (draft, ids, p, u)]
        out, n = ops.chain_speculative_sampling(*args)
        out, n = out.cpu(), n.cpu()
        for b in range(B):
            emitted = out[b, : int(n[b]) + 1]
            assert (p[b, torch.arange(len(emitted)), emitted] > 0).all()


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("B,K,V", [(1, 1, 5), (4, 8, 32000), (64, 4, 100)])
def test_chain_greedy_matches_reference(device, index_dtype, B, K, V):
    gen = torch.Generator().manual_seed(K * V)
    logits = torch.randn(B, K + 1, V, generator=gen)
    target = logits.argmax(-1)
    # Drafts agree with the target up to a random point per row.
    agree = torch.randint(0, K + 1, (B,), generator=gen)
    ids = torch.where(torch.arange(K) < agree[:, None], target[:, :K], (target[:, :K] + 1) % V)
    ids = ids.to(index_dtype)
    for t in (target.to(index_dtype), logits):
        want = ref.chain_greedy_verify(ids, t)
        got = ops.chain_greedy_verify(ids.to(device), t.to(device))
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
        assert torch.equal(got[1].cpu(), agree.to(index_dtype))


def test_chain_greedy_by_hand(device):
    ids = torch.tensor([[5, 7, 9], [1, 2, 3], [4, 4, 4]], device=device, dtype=torch.int32)
    target = torch.tensor([[5, 7, 2, 4], [0, 2, 3, 8], [4, 4, 4, 6]], device=device, dtype=torch.int32)
    out, n = ops.chain_greedy_verify(ids, target)
    assert out.tolist() == [[5, 7, 2, -1], [0, -1, -1, -1], [4, 4, 4, 6]]
    assert n.tolist() == [2, 0, 3]
    assert out.dtype == torch.int32


def test_chain_greedy_logit_ties_take_the_lowest_index(device):
    logits = torch.zeros(1, 2, 6, device=device)
    logits[0, 0, [2, 4]] = 1.0
    out, n = ops.chain_greedy_verify(torch.tensor([[2]], device=device), logits)
    assert out.tolist() == [[2, 0]] and n.tolist() == [1]


def test_chain_greedy_invalid_ids_raise_on_cpu_and_are_never_accepted_on_cuda(device):
    # Draft ids must be in the logits' vocabulary [0, V); with the target given as token ids
    # (no vocabulary) draft and target ids must be >= 0. CUDA cannot raise without a host sync:
    # there an invalid draft is never accepted (the target's ids are emitted as given).
    logits = torch.zeros(1, 4, 5, device=device)
    logits[0, :, 2] = 1.0
    far = torch.full((1, 3), 10**6, device=device)
    negative = torch.tensor([[-1, 2, 2]], device=device)
    target = torch.tensor([[-1, 2, 2, 2]], device=device)
    if device == "cpu":
        cases = [
            ((far, logits), r"draft_ids holds the token id 1000000, outside the vocabulary \[0, 5\)"),
            ((negative, logits), r"draft_ids holds the token id -1, outside the vocabulary"),
            ((negative, target.clamp_min(0)), r"draft_ids holds the token id -1, not a token id"),
            ((far, target), r"target holds the token id -1, not a token id"),
        ]
        for args, match in cases:
            with pytest.raises(ValueError, match=match):
                ops.chain_greedy_verify(*args)
        assert ops.chain_greedy_verify(far, target.clamp_min(0))[1].tolist() == [0]  # no vocabulary
        return
    out, n = ops.chain_greedy_verify(far, logits)
    assert out.tolist() == [[2, -1, -1, -1]] and n.tolist() == [0]
    out, n = ops.chain_greedy_verify(negative, target)  # equal to the target, still rejected
    assert out.tolist() == [[-1, -1, -1, -1]] and n.tolist() == [0]
