"""Token trees for Medusa-style proposers (specdec.trees): Medusa choices, cost-aware choices,
and per-row dynamic trees, each checked against the rule it implements."""

import itertools
import re

import pytest
import torch

from specdec import ops
from specdec.loop.cost_model import CostModel
from specdec.proposers.medusa.trees import auto_choices, dynamic_tree, StaticTree


def node_paths(parents: list[int], ranks: list[int]) -> list[tuple[int, ...]]:
    """The path of ranks of every node (root: ()), from a parents list (parents first)."""
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, len(parents)):
        assert 0 <= parents[i] < i
        paths.append(paths[parents[i]] + (ranks[i],))
    return paths


# ---- StaticTree ---------------------------------------------------------------------------------
def test_medusa_small_example():
    tree = StaticTree.from_choices([(0,), (0, 0), (1,), (0, 1)])
    assert tree.choices == ((0,), (1,), (0, 0), (0, 1))
    assert tree.parents.tolist() == [-1, 0, 0, 1, 1]
    assert tree.depth.tolist() == [0, 1, 1, 2, 2]
    assert tree.rank.tolist() == [-1, 0, 1, 0, 1]
    assert (tree.max_rank, tree.max_depth) == (1, 2)


def test_three_levels_by_hand():
    # Given out of order, as lists: sorted by depth then rank, nodes 1..6 are
    # (0,) (1,) (0, 0) (0, 1) (1, 2) (0, 0, 1).
    tree = StaticTree.from_choices([[1, 2], [0, 0, 1], [1], [0, 1], [0], [0, 0]])
    assert tree.choices == ((0,), (1,), (0, 0), (0, 1), (1, 2), (0, 0, 1))
    assert tree.parents.tolist() == [-1, 0, 0, 1, 1, 2, 3]
    assert tree.depth.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert tree.rank.tolist() == [-1, 0, 1, 0, 1, 2, 1]
    assert (tree.max_rank, tree.max_depth) == (2, 3)
    assert tree.parents.dtype == tree.depth.dtype == tree.rank.dtype == torch.int64


@pytest.mark.parametrize(
    "choices, message",
    [
        ([(0, 3)], "invalid path: (0, 3) needs (0,)"),
        ([(0,), (0, 0, 1)], "invalid path: (0, 0, 1) needs (0, 0)"),
        ([(0,), (-1,)], "invalid path: (-1,): ranks must be >= 0"),
        ([(0,), (0, 1), (0,)], "invalid path: (0,) appears twice"),
        ([(0,), ()], "invalid path: ()"),
        ([(0,), (0.5,)], "invalid path: (0.5,): ranks must be integers"),
        ([], "no paths"),
    ],
)
def test_invalid_choices_name_the_path(choices, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        StaticTree.from_choices(choices)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_tokens_pick_each_nodes_candidate(dtype):
    tree = StaticTree.from_choices([(0,), (2,), (0, 0), (0, 3), (2, 1), (0, 3, 2)])
    B, K, k = 3, 4, 5  # more heads and ranks than the tree uses
    topk_ids = torch.randperm(B * K * k, generator=torch.Generator().manual_seed(0)).view(B, K, k)
    topk_ids = topk_ids.to(dtype)
    root = torch.tensor([100, 101, 102])
    tokens = tree.tokens(root, topk_ids)
    assert tokens.shape == (B, 7) and tokens.dtype == dtype
    for b in range(B):
        assert tokens[b, 0] == root[b]
        for i, path in enumerate(tree.choices, start=1):
            assert tokens[b, i] == topk_ids[b, len(path) - 1, path[-1]]


def test_tokens_need_enough_heads_and_ranks():
    tree = StaticTree.from_choices([(0,), (0, 3)])  # 2 heads, 4 ranks
    root = torch.zeros(2, dtype=torch.int64)
    tree.tokens(root, torch.zeros(2, 2, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="needs 2 heads of 4 candidates"):
        tree.tokens(root, torch.zeros(2, 1, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="needs 2 heads of 4 candidates"):
        tree.tokens(root, torch.zeros(2, 2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="root"):
        tree.tokens(torch.zeros(3, dtype=torch.int64), torch.zeros(2, 2, 4, dtype=torch.int64))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_parents_build_the_medusa_tree(dtype):
    # A bushy prefix-closed set, as Medusa's tuned trees are: the mask from build_tree (C++,
    # from parents) must be Medusa's: each node sees itself and the nodes of its path's prefixes.
    choices = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (2, 0),
               (0, 0, 0, 0)]
    tree = StaticTree.from_choices(choices)
    parents = tree.parents_for(2, "cpu", dtype)
    assert parents.shape == (2, 12) and parents.dtype == dtype and parents.is_contiguous()
    mask, depth, _ = ops.build_tree(parents)
    assert (depth == tree.depth.to(dtype)).all()
    nodes = [()] + list(tree.choices)
    expected = torch.tensor([[a == b[:len(a)] for a in nodes] for b in nodes])
    assert (mask == expected).all()


# ---- auto_choices -------------------------------------------------------------------------------
def greedy_order(acc: list[list[float]], limit: int) -> list[tuple[tuple[int, ...], float]]:
    """Reference: repeatedly take the likeliest path whose parent is in (ties: smallest path)."""
    K, R = len(acc), len(acc[0])
    prob = {}
    for d in range(1, K + 1):
        for path in itertools.product(range(R), repeat=d):
            prob[path] = prob[path[:-1]] * acc[d - 1][path[-1]] if d > 1 else acc[0][path[0]]
    order: list[tuple[tuple[int, ...], float]] = []
    taken: set[tuple[int, ...]] = set()
    while len(order) < min(limit, len(prob)):
        available = [p for p in prob if p not in taken and (len(p) == 1 or p[:-1] in taken)]
        path = min(available, key=lambda p: (-prob[p], p))
        taken.add(path)
        order.append((path, prob[path]))
    return order


@pytest.mark.parametrize("seed", range(6))
def test_auto_choices_is_the_best_greedy_prefix(seed):
    gen = torch.Generator().manual_seed(seed)
    acc = (torch.rand(3, 3, generator=gen, dtype=torch.float64) * 0.8).tolist()
    costs = CostModel({1: 10.0, 2: 10.0 + 4 * torch.rand(1, generator=gen).item(), 40: 60.0})
    max_nodes = 12
    order = greedy_order(acc, max_nodes)
    rates = [(1 + sum(p for _, p in order[:n])) / costs.target(n + 1)
             for n in range(1, max_nodes + 1)]
    best = max(range(len(rates)), key=lambda i: rates[i]) + 1
    chosen = auto_choices(torch.tensor(acc), costs.target, max_nodes=max_nodes)
    assert chosen == [path for path, _ in order[:best]]
    StaticTree.from_choices(chosen)  # prefix-closed


def test_auto_choices_fills_max_nodes_when_passes_cost_the_same():
    acc = [[0.8, 0.5, 0.3, 0.2], [0.7, 0.4, 0.2, 0.1], [0.6, 0.3, 0.2, 0.1]]
    chosen = auto_choices(acc, lambda k: 5.0, max_nodes=40)
    assert len(chosen) == 40 and len(set(chosen)) == 40
    # Best first: probabilities 0.8, 0.56, 0.5, 0.35, 0.336.
    assert chosen[:5] == [(0,), (0, 0), (1,), (1, 0), (0, 0, 0)]
    assert StaticTree.from_choices(chosen).max_depth == 3
    # Fewer paths than max_nodes: all of them.
    assert len(auto_choices([[0.8, 0.5], [0.7, 0.4]], lambda k: 5.0, max_nodes=40)) == 6
    # Nodes that add nothing are left out, even when they cost nothing either.
    assert auto_choices([[0.8, 0.0], [0.5, 0.0]], lambda k: 5.0) == [(0,), (0, 0)]


def test_auto_choices_stays_small_when_passes_grow():
    acc = [[0.8, 0.5, 0.3, 0.2], [0.7, 0.4, 0.2, 0.1], [0.6, 0.3, 0.2, 0.1]]
    steep = CostModel({1: 10.0, 2: 12.0, 64: 300.0})  # ~4.6 ms per extra token
    chosen = auto_choices(acc, steep.target, max_nodes=40)
    assert 1 <= len(chosen) <= 3 and chosen[0] == (0,)
    # Even a hopeless head gets its top candidate: a tree has at least one node.
    assert auto_choices([[0.0, 0.0]], steep.target) == [(0,)]


def test_auto_choices_rejects_bad_inputs():
    with pytest.raises(ValueError, match=r"\[K, R\]"):
        auto_choices([0.5, 0.2], lambda k: 1.0)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        auto_choices([[1.5]], lambda k: 1.0)
    with pytest.raises(ValueError, match="max_nodes"):
        auto_choices([[0.5]], lambda k: 1.0, max_nodes=0)
    with pytest.raises(ValueError, match=r"pass_cost\(2\) = 0.0"):
        auto_choices([[0.5]], lambda k: 0.0)


# ---- dynamic_tree -------------------------------------------------------------------------------
def reference_paths(logprobs: list[list[float]], budget: int
                    ) -> list[tuple[tuple[int, ...], float]]:
    """Every path up to depth K with its score (summed in path order), best first."""
    K, k = len(logprobs), len(logprobs[0])
    scored = []
    for d in range(1, K + 1):
        for path in itertools.product(range(k), repeat=d):
            score = 0.0
            for depth, r in enumerate(path):
                score += logprobs[depth][r]
            scored.append((path, score))
    return sorted(scored, key=lambda ps: -ps[1])[:budget]


def tree_paths(tokens: torch.Tensor, parents: torch.Tensor, ids: torch.Tensor
               ) -> list[tuple[int, ...]]:
    """The rank path of every non-root node of one row (ids unique per (depth, rank))."""
    rank_of = {(d, int(ids[d, r])): r for d in range(ids.shape[0]) for r in range(ids.shape[1])}
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, tokens.shape[0]):
        parent = int(parents[i])
        assert 0 <= parent < i, "parents must come first"
        paths.append(paths[parent] + (rank_of[(len(paths[parent]), int(tokens[i]))],))
    return paths[1:]


@pytest.mark.parametrize("K, k, budget", [(1, 4, 3), (2, 3, 5), (3, 3, 10), (3, 4, 20), (4, 2, 30)])
def test_dynamic_tree_matches_brute_force(K, k, budget):
    gen = torch.Generator().manual_seed(K * 100 + k * 10 + budget)
    B = 4
    logprobs = torch.randn(B, K, 6, generator=gen, dtype=torch.float64).log_softmax(-1)
    logprobs = logprobs.topk(k, dim=-1).values  # the heads' top-k, best first
    ids = torch.stack([torch.randperm(K * k, generator=gen) for _ in range(B)]).view(B, K, k)
    tokens, parents = dynamic_tree(logprobs, ids, budget)
    assert tokens.shape == parents.shape == (B, 1 + budget)
    assert (tokens[:, 0] == -1).all() and (parents[:, 0] == -1).all()
    ops.build_tree(parents)  # raises on an invalid tree
    shapes = set()
    for b in range(B):
        expected = reference_paths(logprobs[b].tolist(), budget)
        got = tree_paths(tokens[b], parents[b], ids[b])
        assert got == [path for path, _ in expected]  # same paths, best first
        shapes.add(tuple(parents[b].tolist()))
    if budget > k:
        assert len(shapes) > 1, "rows should get trees of different shapes"


def test_dynamic_tree_ties_keep_parents_first():
    # Zero log-probabilities and repeated values: children tie with their parents and
    # siblings tie with each other, yet every node's parent is chosen and comes first.
    logprobs = torch.tensor([[[0.0, 0.0, -1.0], [0.0, -1.0, -1.0], [0.0, 0.0, 0.0]],
                             [[-1.0, -1.0, -1.0], [0.0, 0.0, 0.0], [-2.0, -2.0, -2.0]]])
    ids = torch.arange(9).view(1, 3, 3).expand(2, 3, 3).contiguous()
    for budget in range(1, 40):
        tokens, parents = dynamic_tree(logprobs, ids, budget)
        ops.build_tree(parents)
        for b in range(2):
            paths = tree_paths(tokens[b], parents[b], ids[b])
            scores = [sum(float(logprobs[b, d, r]) for d, r in enumerate(p)) for p in paths]
            assert scores == sorted(scores, reverse=True)
            unchosen = [s for p, s in reference_paths(logprobs[b].tolist(), 39) if p not in paths]
            assert all(s <= scores[-1] for s in unchosen), "a better path was left out"


def test_dynamic_tree_pads_past_the_number_of_paths():
    logprobs = torch.tensor([[[-0.1, -2.0], [-0.5, -1.0]]])
    ids = torch.tensor([[[10, 11], [20, 21]]], dtype=torch.int32)
    tokens, parents = dynamic_tree(logprobs, ids, 8)  # 2 + 4 paths
    assert tokens.dtype == parents.dtype == torch.int32
    assert tokens.tolist() == [[-1, 10, 20, 21, 11, 20, 21, -1, -1]]
    assert parents.tolist() == [[-1, 0, 1, 1, 0, 4, 4, 0, 0]]


def test_dynamic_tree_rejects_bad_inputs():
    ids = torch.zeros(1, 2, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="<= 0"):
        dynamic_tree(torch.full((1, 2, 2), 0.5), ids, 3)
    with pytest.raises(ValueError, match=r"\[B, K, k\]"):
        dynamic_tree(torch.zeros(1, 2, 3), ids, 3)
    with pytest.raises(TypeError, match="int64/int32"):
        dynamic_tree(torch.zeros(1, 2, 2), ids.float(), 3)
    with pytest.raises(ValueError, match="budget"):
        dynamic_tree(torch.zeros(1, 2, 2), ids, 0)
