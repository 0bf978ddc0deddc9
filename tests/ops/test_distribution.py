"""The sampling ops are lossless: emitted tokens follow the target's distribution.

Each test verifies N >= 1e5 independent rows (1e4 on the simulated GPU) in one call and checks
the empirical distribution of the emitted tokens against the exact target distribution by
total-variation distance, at 3 / sqrt(n) for n samples (about three times the expected
distance on these small vocabularies). The drafts of every row are drawn afresh from the draft
distribution, as a real drafter would.
"""

import torch
from support.ops import random_probs

from specdec import ops

N = 100_000


def rows(device) -> int:
    """N; a tenth of it on the simulated GPU (docs/cuda_simulation.md), whose 512 fibers per row
    take about a millisecond (the bounds scale with the number of rows)."""
    return N // 10 if device == "cuda_sim" else N


def tv(samples: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(samples.long(), minlength=probs.numel()).double()
    return 0.5 * float((counts / counts.sum() - probs.double()).abs().sum())


def assert_follows(samples: torch.Tensor, probs: torch.Tensor, min_samples: int = 1000) -> None:
    assert samples.numel() >= min_samples, "too few samples to test"
    assert (samples >= 0).all()
    assert (probs[samples.long()] > 0).all(), "a zero-probability token was emitted"
    assert tv(samples, probs) < 3 / samples.numel() ** 0.5


def assert_conditionals_follow(given: torch.Tensor, then: torch.Tensor, dists: torch.Tensor,
                               min_rows: int = 1000) -> None:
    """For rows with ``given[r] = x >= 0`` (-1: a row not to test), ``then`` follows ``dists[x]``,
    checked for every x with at least ``min_rows`` rows. Those x must hold 90% of the rows, so
    a test whose rows spread too thin fails rather than checking nothing."""
    checked = 0
    for x in range(dists.shape[0]):
        rows = given == x
        if int(rows.sum()) >= min_rows:
            assert_follows(then[rows], dists[x], min_rows)
            checked += int(rows.sum())
    total = int((given >= 0).sum())
    assert checked >= 0.9 * total > 0, f"conditionals checked on {checked} of {total} rows"


def test_chain_sampling_is_lossless(device):
    # The target's next-token distribution depends on the previous token (a bigram model), so
    # conditional distributions along the chain are checked too.
    N = rows(device)
    gen = torch.Generator().manual_seed(0)
    V, K = 6, 3
    first = random_probs(V, gen=gen)
    bigram = random_probs(V, V, gen=gen)     # bigram[x] = target's distribution after token x
    draft_first = random_probs(V, gen=gen, sparsity=0.0)
    draft_bigram = random_probs(V, V, gen=gen, sparsity=0.0)
    for stochastic in (True, False):
        ids = torch.empty(N, K, dtype=torch.long)
        q = torch.empty(N, K, V)
        q[:, 0] = draft_first
        ids[:, 0] = torch.multinomial(draft_first, N, replacement=True, generator=gen)
        for i in range(1, K):
            q[:, i] = draft_bigram[ids[:, i - 1]]
            ids[:, i] = torch.multinomial(q[:, i], 1, generator=gen)[:, 0]
        p = torch.cat([first.expand(N, 1, V), bigram[ids]], 1)  # p[:, i] follows drafts < i
        u = torch.rand(N, K + 1, generator=gen)
        draft = q.to(device) if stochastic else None
        out, n = ops.chain_speculative_sampling(draft, ids.to(device), p.to(device), u.to(device))
        out, n = out.cpu(), n.cpu()
        assert_follows(out[:, 0], first)
        # Given the first emitted token x was an accepted draft, the second follows bigram[x].
        assert_conditionals_follow(torch.where(n >= 1, out[:, 0], -1), out[:, 1], bigram, N // 100)
        assert 0 < float(n.float().mean()) < K  # both acceptances and rejections occurred


def test_tree_sampling_is_lossless_deterministic_drafts(device):
    #        0
    #      / | \        children tried in order; nodes 1 and 2 may hold the same token
    #     1  2  3
    #    / \
    #   4   5
    N = rows(device)
    gen = torch.Generator().manual_seed(1)
    V = 6
    parents = torch.tensor([-1, 0, 0, 0, 1, 1]).expand(N, 6)
    root = random_probs(V, gen=gen)
    bigram = random_probs(V, V, gen=gen)   # target after a token x, whatever came before
    tokens = torch.randint(0, V, (N, 6), generator=gen)
    p = torch.cat([root.expand(N, 1, V), bigram[tokens[:, 1:]]], 1)
    u = torch.rand(N, 6, generator=gen)
    path, n, nxt = ops.tree_speculative_sampling(*(t.to(device) for t in (tokens, parents, p, u)))
    path, n, nxt = path.cpu(), n.cpu(), nxt.cpu()
    first = torch.where(n >= 1, tokens.gather(1, path[:, 1:2].clamp_min(0))[:, 0], nxt)
    assert_follows(first, root)
    # Given the first token x came from an accepted node, the next one follows bigram[x].
    second = torch.where(n >= 2, tokens.gather(1, path[:, 2:3].clamp_min(0))[:, 0], nxt)
    assert_conditionals_follow(torch.where(n >= 1, first, -1), second, bigram, N // 100)


def test_tree_sampling_is_lossless_stochastic_drafts(device):
    # Root with three children drawn from q: i.i.d. (with replacement), or without replacement
    # (each sibling's draft distribution excludes the earlier siblings' tokens).
    N = rows(device)
    gen = torch.Generator().manual_seed(2)
    V, C = 5, 3
    parents = torch.tensor([-1, 0, 0, 0]).expand(N, C + 1)
    root = random_probs(V, gen=gen)
    bigram = random_probs(V, V, gen=gen)
    q = random_probs(V, gen=gen, sparsity=0.0)
    for replacement in (True, False):
        tokens = torch.zeros(N, C + 1, dtype=torch.long)
        draft = torch.zeros(N, C + 1, V)
        left = q.expand(N, V).clone()
        for c in range(1, C + 1):
            draft[:, c] = left / left.sum(-1, keepdim=True)
            tokens[:, c] = torch.multinomial(draft[:, c], 1, generator=gen)[:, 0]
            if not replacement:
                left.scatter_(1, tokens[:, c : c + 1], 0.0)
        p = torch.cat([root.expand(N, 1, V), bigram[tokens[:, 1:]]], 1)
        u = torch.rand(N, C + 1, generator=gen)
        path, n, nxt = ops.tree_speculative_sampling(
            *(t.to(device) for t in (tokens, parents, p, u)), draft_probs=draft.to(device)
        )
        path, n, nxt = path.cpu(), n.cpu(), nxt.cpu()
        first = torch.where(n >= 1, tokens.gather(1, path[:, 1:2].clamp_min(0))[:, 0], nxt)
        assert_follows(first, root)
        assert_conditionals_follow(torch.where(n >= 1, first, -1), nxt, bigram, N // 100)


def peaked_rows(B: int, V: int, x: int, gen: torch.Generator) -> torch.Tensor:
    """[B, V] float32 rows with p(x) = 0.9999 and the rest spread at random over the other ids."""
    rest = torch.rand(B, V, generator=gen) + 0.5
    rest[:, x] = 0.0
    p = rest / rest.sum(-1, keepdim=True) * 1e-4
    p[:, x] = 0.9999
    return p


def test_rejecting_a_peaked_token_draws_from_the_rest(device):
    # Deterministic drafts at Qwen's vocabulary size: p(x) = 0.9999 and x rejected in every row,
    # the draw's uniform in the top 2^-10 of the rest's CDF, where rounding of the rest's total
    # shows (taking w(x) off a float32 sum of all weights sent about 1 row in 5 here to the last
    # id). The last id may be drawn only as often as the exact float64 inverse CDF draws it;
    # x never.
    gen = torch.Generator().manual_seed(3)
    B, V, x, top = 256, 152064, 7, 2**-10
    p = peaked_rows(B, V, x, gen)
    u_draw = (1 - top * (1 - torch.rand(B, generator=gen))).clamp_max(1 - 2**-24)
    reject = torch.full((B,), 0.99995)  # u * 1 >= p(x): rejected
    rest = p.double().index_fill(1, torch.tensor([x]), 0.0).cumsum(-1)
    exact = torch.searchsorted(rest, u_draw.double()[:, None] * rest[:, -1:], right=True)[:, 0]
    target = torch.stack([p, p], 1).to(device)  # the second position is never used

    out, n = ops.chain_speculative_sampling(
        None, torch.full((B, 1), x, device=device), target,
        torch.stack([reject, u_draw], 1).to(device))
    assert (n == 0).all()
    path, n_tree, nxt = ops.tree_speculative_sampling(
        torch.tensor([[0, x]] * B, device=device), torch.tensor([[-1, 0]] * B, device=device),
        target, torch.stack([u_draw, reject], 1).to(device))
    assert (n_tree == 0).all()
    for drawn in (out[:, 0].cpu(), nxt.cpu()):
        assert ((drawn >= 0) & (drawn < V)).all() and (drawn != x).all()
        assert int((drawn == V - 1).sum()) <= int((exact == V - 1).sum()) + 2
        # Rounding may move a draw across a token boundary, rarely: the cumulative weights are
        # float64 sums of float32 sums of at most 512 weights (CUDA: docs/cuda_kernels.md).
        assert float((drawn == exact).double().mean()) > 0.99
