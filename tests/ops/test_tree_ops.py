"""build_tree, tree_verify_greedy and tree_speculative_sampling against the reference and by hand."""

import pytest
import torch
from support.ops import assert_draws_match, random_parents, random_probs

import specdec.ops.reference as ref
from specdec import TypicalAcceptance, ops

INDEX_DTYPES = [torch.int64, torch.int32]


def random_trees(B: int, T: int, gen: torch.Generator, dtype=torch.int64) -> torch.Tensor:
    return torch.tensor([random_parents(T, gen) for _ in range(B)], dtype=dtype)


# A hand-built tree:      0
#                       / | \
#                      1  2  3
#                     / \     \
#                    4   5     6
#                    |
#                    7
HAND_PARENTS = [-1, 0, 0, 0, 1, 1, 3, 4]


def test_build_tree_by_hand(device):
    mask, depth, paths = ops.build_tree(torch.tensor([HAND_PARENTS], device=device))
    assert depth.tolist() == [[0, 1, 1, 1, 2, 2, 2, 3]]
    assert paths[0, :4].tolist() == [
        [0, 2, -1, -1, -1, -1, -1, -1],
        [0, 1, 5, -1, -1, -1, -1, -1],
        [0, 3, 6, -1, -1, -1, -1, -1],
        [0, 1, 4, 7, -1, -1, -1, -1],
    ]
    assert (paths[0, 4:] == -1).all()
    ancestors = {i: [j for j in range(8) if mask[0, i, j]] for i in range(8)}
    assert ancestors == {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 3], 4: [0, 1, 4], 5: [0, 1, 5],
                         6: [0, 3, 6], 7: [0, 1, 4, 7]}
    _, _, cut = ops.build_tree(torch.tensor([HAND_PARENTS], device=device), max_leaves=2, max_depth=1)
    assert cut.tolist() == [[[0, 2], [0, 1]]]


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("B,T", [(1, 1), (1, 2), (5, 17), (64, 64), (2, 200), (2, 600)])
def test_build_tree_matches_reference(device, index_dtype, B, T):
    parents = random_trees(B, T, torch.Generator().manual_seed(T), index_dtype)
    for limits in ({}, {"max_leaves": 3, "max_depth": 2}):
        got = ops.build_tree(parents.to(device), **limits)
        want = ref.build_tree(parents, **limits)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g.cpu(), w)


def test_build_tree_of_a_chain_is_causal(device):
    T = 9
    mask, depth, paths = ops.build_tree(torch.arange(-1, T - 1, device=device)[None])
    assert torch.equal(mask[0].cpu(), torch.ones(T, T, dtype=torch.bool).tril())
    assert depth[0].tolist() == list(range(T)) and paths[0, 0].tolist() == list(range(T))


def test_tree_verify_greedy_by_hand(device):
    tokens = torch.tensor([[0, 10, 20, 30, 11, 12, 31, 13]], device=device)
    parents = torch.tensor([HAND_PARENTS], device=device)
    # Target after each node: root -> 10 (node 1), node 1 -> 11 (node 4), node 4 -> 13 (node 7).
    target = torch.tensor([[10, 11, 0, 0, 13, 0, 0, 99]], device=device)
    path, n, nxt = ops.tree_verify_greedy(tokens, parents, target)
    assert path.tolist() == [[0, 1, 4, 7, -1, -1, -1, -1]] and n.tolist() == [3]
    assert nxt.tolist() == [99]
    # Cut at two accepted nodes: the third accepted node's token is the next token.
    path, n, nxt = ops.tree_verify_greedy(tokens, parents, target, max_accept=2)
    assert path.tolist() == [[0, 1, 4]] and n.tolist() == [2] and nxt.tolist() == [13]
    # Nothing matches: only the target's token at the root.
    path, n, nxt = ops.tree_verify_greedy(tokens, parents, torch.full_like(target, 5))
    assert path[0, :2].tolist() == [0, -1] and n.tolist() == [0] and nxt.tolist() == [5]


def test_tree_verify_greedy_duplicate_siblings_take_the_deeper_path(device):
    # Nodes 1 and 2 both hold token 7; only node 2 has a matching child.
    tokens = torch.tensor([[0, 7, 7, 8]], device=device)
    parents = torch.tensor([[-1, 0, 0, 2]], device=device)
    target = torch.tensor([[7, 5, 8, 9]], device=device)
    path, n, nxt = ops.tree_verify_greedy(tokens, parents, target)
    assert path.tolist() == [[0, 2, 3, -1]] and n.tolist() == [2] and nxt.tolist() == [9]


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("B,T,V", [(1, 1, 3), (4, 8, 3), (64, 64, 4), (3, 33, 2)])
def test_tree_verify_greedy_matches_reference(device, index_dtype, B, T, V):
    gen = torch.Generator().manual_seed(B + T + V)
    parents = random_trees(B, T, gen, index_dtype)
    # A tiny vocabulary makes long accepted paths common.
    tokens = torch.randint(0, V, (B, T), generator=gen, dtype=index_dtype)
    logits = torch.randn(B, T, V, generator=gen)
    for target in (logits.argmax(-1).to(index_dtype), logits):
        for max_accept in (None, 2):
            want = ref.tree_verify_greedy(tokens, parents, target, max_accept)
            got = ops.tree_verify_greedy(tokens.to(device), parents.to(device), target.to(device), max_accept)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and torch.equal(g.cpu(), w)


def tree_sampling_inputs(B, T, V, gen, index_dtype, stochastic):
    parents = random_trees(B, T, gen, index_dtype)
    p = random_probs(B, T, V, gen=gen)
    q = random_probs(B, T, V, gen=gen) if stochastic else None
    # Tokens drawn from the target at the parent half of the time, so paths get accepted.
    src = q if stochastic else random_probs(B, T, V, gen=gen)
    parent_p = torch.gather(p, 1, parents.clamp_min(0).long()[..., None].expand(B, T, V))
    pick = torch.rand(B, T, generator=gen) < 0.5
    flat = torch.where(pick[..., None], parent_p, src).reshape(-1, V)
    tokens = torch.multinomial(flat, 1, generator=gen).reshape(B, T).to(index_dtype)
    u = torch.rand(B, T, generator=gen)
    return tokens, parents, p, u, q


def assert_tree_matches(got, want, device):
    (path, n, nxt), (want_path, want_n, want_nxt) = got, want
    assert torch.equal(path.cpu(), want_path) and torch.equal(n.cpu(), want_n)
    assert_draws_match(nxt, want_nxt, device)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("B,T,V", [(1, 1, 5), (8, 8, 6), (16, 64, 50), (2, 16, 152064)])
def test_tree_sampling_matches_reference(device, index_dtype, stochastic, B, T, V):
    gen = torch.Generator().manual_seed(B * T + V + stochastic)
    tokens, parents, p, u, q = tree_sampling_inputs(B, T, V, gen, index_dtype, stochastic)
    for max_accept in (None, 1):
        want = ref.tree_speculative_sampling(tokens, parents, p, u, q, max_accept=max_accept)
        to = lambda t: None if t is None else t.to(device)  # noqa: E731
        got = ops.tree_speculative_sampling(to(tokens), to(parents), to(p), to(u), to(q), max_accept=max_accept)
        assert_tree_matches(got, want, device)


@pytest.mark.parametrize("B,T,V", [(4, 8, 6), (32, 32, 20)])
def test_tree_typical_acceptance_matches_reference(device, B, T, V):
    gen = torch.Generator().manual_seed(T)
    tokens, parents, p, u, _ = tree_sampling_inputs(B, T, V, gen, torch.int64, False)
    typical = TypicalAcceptance(posterior_threshold=0.2, posterior_alpha=0.5)
    want = ref.tree_speculative_sampling(tokens, parents, p, u, typical=(0.2, 0.5))
    got = ops.tree_speculative_sampling(*(t.to(device) for t in (tokens, parents, p, u)), typical=typical)
    assert_tree_matches(got, want, device)
    assert int(want[1].sum()) > 0  # the test exercises accepted paths


def test_tree_sampling_by_hand(device):
    tokens = torch.tensor([[0, 1, 2, 3]], device=device)
    parents = torch.tensor([[-1, 0, 0, 2]], device=device)
    p = torch.tensor([[[0.0, 0.5, 0.5, 0.0],   # root: token 1 (node 1) or 2 (node 2)
                       [1.0, 0.0, 0.0, 0.0],
                       [0.0, 0.0, 0.0, 1.0],   # node 2 -> token 3 (node 3) surely
                       [0.0, 1.0, 0.0, 0.0]]], device=device)
    # u[1] = 0.6 rejects node 1 (0.6 >= 0.5); node 2 then has p = 0.5 / 0.5 = 1: accepted.
    u = torch.tensor([[0.3, 0.6, 0.99, 0.5]], device=device)
    path, n, nxt = ops.tree_speculative_sampling(tokens, parents, p, u)
    assert path.tolist() == [[0, 2, 3, -1]] and n.tolist() == [2] and nxt.tolist() == [1]
    # u[1] = 0.4 accepts node 1, a leaf: next token from p at node 1.
    u[0, 1] = 0.4
    path, n, nxt = ops.tree_speculative_sampling(tokens, parents, p, u)
    assert path.tolist() == [[0, 1, -1, -1]] and n.tolist() == [1] and nxt.tolist() == [0]


def test_tree_sampling_one_hot_targets_accept_the_matching_path(device):
    # Every node's target puts all mass on the token of its first child: the first-child chain
    # down to a leaf is always accepted, whatever the uniforms.
    gen = torch.Generator().manual_seed(3)
    B, T, V = 32, 24, 40
    parents = random_trees(B, T, gen)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    first_child = torch.full((B, T), -1)
    for b in range(B):
        for c in range(T - 1, 0, -1):
            first_child[b, parents[b, c]] = c
    nxt_tok = torch.where(first_child >= 0, torch.gather(tokens, 1, first_child.clamp_min(0)), 7)
    p = torch.nn.functional.one_hot(nxt_tok, V).float()
    u = torch.rand(B, T, generator=gen)
    path, n, nxt = ops.tree_speculative_sampling(*(t.to(device) for t in (tokens, parents, p, u)))
    depth = ops.build_tree(parents)[1]
    for b in range(B):
        node, expected = 0, [0]
        while first_child[b, node] >= 0:
            node = int(first_child[b, node])
            expected.append(node)
        assert path[b, : len(expected)].tolist() == expected
        assert int(n[b]) == int(depth[b, node]) and int(nxt[b]) == 7


def test_padding_nodes_are_never_accepted(device):
    # Row 1 has only one candidate; its other nodes are padding (-1) under a real chain.
    tokens = torch.tensor([[0, 1, 2, 3], [0, 1, -1, -1]], device=device)
    parents = torch.tensor([[-1, 0, 1, 2], [-1, 0, 1, 2]], device=device)
    p = torch.nn.functional.one_hot(torch.tensor([[1, 2, 3, 0], [1, 2, 3, 0]]), 4).float().to(device)
    u = torch.rand(2, 4, device=device)
    path, n, nxt = ops.tree_speculative_sampling(tokens, parents, p, u)
    assert n.tolist() == [3, 1] and nxt.tolist() == [0, 2]
    path, n, nxt = ops.tree_verify_greedy(tokens, parents, p)
    assert n.tolist() == [3, 1] and nxt.tolist() == [0, 2]


def test_tree_greedy_invalid_ids_raise_on_cpu_and_are_never_accepted_on_cuda(device):
    # As tree_speculative_sampling: node tokens (root excluded) in the logits' vocabulary [0, V)
    # or -1 (padding); with the target as token ids (no vocabulary) tokens >= -1 and target
    # ids >= 0. CUDA cannot raise without a host sync: a negative token is never accepted, a
    # token past the vocabulary never equals the argmax.
    parents = torch.tensor([[-1, 0, 0]], device=device)
    logits = torch.zeros(1, 3, 4, device=device)
    logits[0, 0, 3] = 1.0
    far = torch.tensor([[0, 10**6, 3]], device=device)
    below = torch.tensor([[0, -2, -2]], device=device)
    target = torch.tensor([[-2, 0, 0]], device=device)
    if device == "cpu":
        cases = [
            ((far, parents, logits), r"tree_tokens holds the token id 1000000, outside the vocabulary \[0, 4\)"),
            ((below, parents, logits), r"tree_tokens holds the token id -2, outside the vocabulary"),
            ((below, parents, target.clamp_min(0)), r"tree_tokens holds the token id -2, not a token id"),
            ((far, parents, target), r"target holds the token id -2, not a token id"),
        ]
        for args, match in cases:
            with pytest.raises(ValueError, match=match):
                ops.tree_verify_greedy(*args)
        return
    path, n, nxt = ops.tree_verify_greedy(far, parents, logits)
    assert path.tolist() == [[0, 2, -1]] and n.tolist() == [1]
    path, n, nxt = ops.tree_verify_greedy(below, parents, target)  # equal to the target, rejected
    assert path.tolist() == [[0, -1, -1]] and n.tolist() == [0] and nxt.tolist() == [-2]


def test_tree_sampling_acceptance_mass_after_rejections_does_not_cancel(device):
    # Root children with p = 0.1 and 0.89999, both rejected, then p3 = half of what is left. In
    # float32 1 - 0.1 rounds by 2e-8, 0.2% of the 1e-5 left after 0.89999: a float32 running
    # difference misjudges u * m < p3 for u within 0.2% of p3 / m. With m = 1 - (p of the
    # rejected tokens) node 3 is accepted just below p3 / m and rejected just above.
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    p1, p2 = f32(0.1), f32(0.89999)
    left = 1.0 - float(p1) - float(p2)
    p3 = f32(left / 2)
    root = torch.stack([f32(left - float(p3)), p1, p2, p3])
    p = root.expand(2, 4, 4).contiguous()
    ratio = float(p3) / left
    u = torch.tensor([[0.5, 0.99999, 0.99999, ratio * (1 - 1e-4)],
                      [0.5, 0.99999, 0.99999, ratio * (1 + 1e-4)]])
    tokens, parents = torch.tensor([[0, 1, 2, 3]] * 2), torch.tensor([[-1, 0, 0, 0]] * 2)
    path, n, nxt = ops.tree_speculative_sampling(*(t.to(device) for t in (tokens, parents, p, u)))
    assert n.tolist() == [1, 0] and path[0, 1] == 3 and nxt[1] == 0
    want = ref.tree_speculative_sampling(tokens, parents, p, u)
    assert torch.equal(n.cpu(), want[1]) and torch.equal(nxt.cpu(), want[2])


def test_tree_sampling_stochastic_many_rejected_siblings(device):
    # Wide trees whose drafted tokens the target mostly rejects: many residual updates in a row,
    # at one node and across nodes (on CUDA, each reads a scratch row that the next rewrites).
    gen = torch.Generator().manual_seed(11)
    B, V = 64, 20000
    parents = torch.tensor([[-1, 0, 0, 0, 0, 1, 1, 1, 2, 2, 5, 5, 5, 8, 8, 8]] * B)
    T = parents.shape[1]
    p = random_probs(B, T, V, gen=gen)
    q = random_probs(B, T, V, gen=gen)
    tokens = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(B, T)
    u = torch.rand(B, T, generator=gen)
    want = ref.tree_speculative_sampling(tokens, parents, p, u, q)
    args = [t.to(device) for t in (tokens, parents, p, u, q)]
    first = ops.tree_speculative_sampling(*args)
    again = ops.tree_speculative_sampling(*args)
    assert_tree_matches(first, want, device)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
