"""Token trees for Medusa-style proposers (heads that each give a top-k list for one depth,
whatever the path above it). Node 0 is the root, a parent precedes its children, as
:func:`specdec.ops.build_tree` expects:

- :class:`StaticTree`: a fixed tree from Medusa choices (FasterDecoding/Medusa's format: each
  path a tuple of top-k ranks, one per depth), the same for every row and step;
- :func:`auto_choices`: such choices picked from the heads' measured per-rank accuracies and
  the target's pass costs, as large as pays for itself;
- :func:`dynamic_tree`: a tree per row and step, the paths with the highest cumulative
  log-probability under the heads.
"""

from __future__ import annotations

import dataclasses
import heapq
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor



Path = tuple[int, ...]


def _normalise(choices: Sequence[Sequence[int]]) -> tuple[Path, ...]:
    """The paths as tuples, sorted by depth then rank (so parents come first), after checking
    that they form a tree under the root."""
    if len(choices) == 0:
        raise ValueError("Medusa choices: no paths (give at least one, e.g. [(0,)])")
    paths: list[Path] = []
    for raw in choices:
        try:
            path = tuple(operator.index(r) for r in raw)
        except TypeError:
            raise ValueError(f"invalid path: {tuple(raw)!r}: ranks must be integers") from None
        if not path:
            raise ValueError("invalid path: (): the root is implicit, a path has a rank per depth")
        if min(path) < 0:
            raise ValueError(f"invalid path: {path}: ranks must be >= 0")
        paths.append(path)
    seen: set[Path] = set()
    for path in paths:
        if path in seen:
            raise ValueError(f"invalid path: {path} appears twice")
        seen.add(path)
    for path in paths:
        if len(path) > 1 and path[:-1] not in seen:
            raise ValueError(f"invalid path: {path} needs {path[:-1]}")
    # Lexicographic order within a depth keeps Medusa's node order (its generate_medusa_buffers
    # sorts the same way), so trees and accuracies tuned there line up with ours.
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


@dataclass(frozen=True, eq=False)
class StaticTree:
    """A fixed token tree from Medusa choices; build it with :meth:`from_choices`.

    Node 0 is the root; node i > 0 is ``choices[i - 1]``: at depth ``len(path)``, the
    ``path[-1]``-th candidate of head ``len(path)``, under the node of ``path[:-1]``.
    ``parents``, ``depth`` and ``rank`` are ``[T]`` int64 CPU tensors (``rank`` is -1 at the
    root); the heads must give at least ``max_depth`` lists of ``max_rank + 1`` candidates.

    Example:
        >>> tree = StaticTree.from_choices([(0,), (0, 0), (1,), (0, 1)])
        >>> tree.choices
        ((0,), (1,), (0, 0), (0, 1))
        >>> tree.parents.tolist(), tree.depth.tolist(), tree.rank.tolist()
        ([-1, 0, 0, 1, 1], [0, 1, 1, 2, 2], [-1, 0, 1, 0, 1])
        >>> topk_ids = torch.tensor([[[10, 11], [20, 21]]])   # [B=1, heads=2, k=2]
        >>> tree.tokens(torch.tensor([7]), topk_ids).tolist()
        [[7, 10, 11, 20, 21]]
        >>> tree.parents_for(2, torch.device("cpu")).shape
        torch.Size([2, 5])
    """

    choices: tuple[Path, ...]
    parents: Tensor
    depth: Tensor
    rank: Tensor
    max_rank: int
    max_depth: int

    @classmethod
    def from_choices(cls, choices: Sequence[Sequence[int]]) -> StaticTree:
        """The tree of Medusa choices, e.g. ``[(0,), (0, 0), (1,), (0, 1)]``; raises a
        ``ValueError`` naming the first invalid path (a missing prefix, a negative rank, a
        duplicate), or when there is none."""
        paths = _normalise(choices)
        node = {path: i + 1 for i, path in enumerate(paths)}
        parents = [-1] + [node.get(path[:-1], 0) for path in paths]  # depth-1 paths: the root
        return cls(
            choices=paths,
            parents=torch.tensor(parents, dtype=torch.int64),
            depth=torch.tensor([0] + [len(p) for p in paths], dtype=torch.int64),
            rank=torch.tensor([-1] + [p[-1] for p in paths], dtype=torch.int64),
            max_rank=max(max(p) for p in paths),
            max_depth=len(paths[-1]),
        )

    def tokens(self, root: Tensor, topk_ids: Tensor) -> Tensor:
        """The node tokens ``[B, T]`` (dtype and device of ``topk_ids``): ``root [B]`` at node 0,
        ``topk_ids[:, d - 1, r]`` at a node of depth d and rank r (``topk_ids [B, K, k]``: head
        d's candidates best first, ``K >= max_depth``, ``k > max_rank``)."""
        if topk_ids.dim() != 3 or root.shape != topk_ids.shape[:1]:
            raise ValueError(f"StaticTree.tokens: expected root [B] and topk_ids [B, K, k], got "
                             f"{tuple(root.shape)} and {tuple(topk_ids.shape)}")
        if topk_ids.shape[1] < self.max_depth or topk_ids.shape[2] <= self.max_rank:
            raise ValueError(f"StaticTree.tokens: the tree needs {self.max_depth} heads of "
                             f"{self.max_rank + 1} candidates, topk_ids has "
                             f"{tuple(topk_ids.shape[1:])}")
        device = topk_ids.device
        nodes = topk_ids[:, self.depth[1:].to(device) - 1, self.rank[1:].to(device)]
        return torch.cat([root.to(topk_ids.dtype).unsqueeze(1), nodes], dim=1)

    def to(self, device: torch.device | str) -> StaticTree:
        """The tree with its index tensors on ``device`` (moved once, not at every step)."""
        return dataclasses.replace(self, parents=self.parents.to(device), depth=self.depth.to(device),
                                   rank=self.rank.to(device))

    def parents_for(self, batch: int, device: torch.device | str,
                    dtype: torch.dtype = torch.int64) -> Tensor:
        """``parents`` repeated for ``batch`` rows: ``[batch, T]`` on ``device`` (contiguous, as
        the ops take it); ``dtype`` matches the tokens' when the ops get int32 indices."""
        return self.parents.to(device=device, dtype=dtype).repeat(batch, 1)


def auto_choices(
    rank_accuracy: Tensor | Sequence[Sequence[float]],
    pass_cost: Callable[[int], float],
    max_nodes: int = 64,
) -> list[Path]:
    """Medusa choices that maximise the expected tokens per step over the cost of its pass.

    ``rank_accuracy[k][r]`` (``[K, R]``) is the probability, measured on held-out data, that
    head k + 1's rank-r candidate is the right token. As in Medusa, a path is accepted with the
    product of its ranks' accuracies (heads taken as independent). Nodes are added best path
    first (a path becomes available once its parent is in), so the n-node prefix of that order
    is expected to emit ``1 + sum of its paths' probabilities`` tokens per step for a pass over
    n + 1 tokens costing ``pass_cost(n + 1)`` (e.g. ``CostModel.target``). Returns the prefix,
    of 1 to ``max_nodes`` nodes, with the most expected tokens per unit of cost (the smallest
    among equals), in the order added (prefix-closed; :meth:`StaticTree.from_choices` takes it).

    Example: flat pass costs (a GPU) grow the tree to ``max_nodes``; costs rising with the width
    (a CPU) keep it to the likeliest paths.

        >>> accuracy = [[0.7, 0.1, 0.05], [0.5, 0.1, 0.05], [0.4, 0.1, 0.05]]
        >>> len(auto_choices(accuracy, lambda k: 10.0, max_nodes=20))
        20
        >>> from specdec.loop.cost_model import CostModel
        >>> cpu = CostModel({1: 10.0, 2: 11.0, 4: 14.0, 16: 40.0})
        >>> auto_choices(accuracy, cpu.target, max_nodes=20)
        [(0,), (0, 0)]
    """
    order, probs = ranked_paths(rank_accuracy, max_nodes)
    return order[:best_prefix(cumulative(probs), pass_cost, smallest=1)]


def cumulative(probs: Sequence[float]) -> list[float]:
    """``[0, p1, p1 + p2, ..]``: the expected accepted tokens of the first n ranked paths."""
    return [0.0, *torch.tensor(list(probs), dtype=torch.float64).cumsum(0).tolist()]


def best_prefix(expected: Sequence[float], pass_cost: Callable[[int], float], smallest: int = 0,
                scale: float = 1.0) -> int:
    """The n in ``smallest .. len(expected) - 1`` with the most expected tokens per unit of
    cost, ``(1 + scale * expected[n]) / pass_cost(n + 1)`` (the smallest among equals).

    Example:
        >>> best_prefix([0.0, 0.9, 1.2], lambda k: 10.0 + k), best_prefix([0.0, 0.1, 0.15], lambda k: 10.0 * k)
        (2, 0)
    """
    best_rate, best_n = -1.0, smallest
    for n in range(smallest, len(expected)):
        cost = pass_cost(n + 1)
        if not cost > 0:
            raise ValueError(f"auto_choices: pass_cost({n + 1}) = {cost}, must be > 0")
        if (1 + scale * expected[n]) / cost > best_rate:
            best_rate, best_n = (1 + scale * expected[n]) / cost, n
    return best_n


def ranked_paths(rank_accuracy: Tensor | Sequence[Sequence[float]], max_nodes: int) -> tuple[list[Path], list[float]]:
    """The ``max_nodes`` most probable paths of head ranks, best first (a path after its
    parent: any first n form a tree), and each path's probability (the product of its ranks'
    accuracies, heads taken as independent).

    Example:
        >>> paths, probs = ranked_paths([[0.7, 0.2], [0.5, 0.1]], 3)
        >>> paths, [round(p, 2) for p in probs]
        ([(0,), (0, 0), (1,)], [0.7, 0.35, 0.2])
    """
    acc = torch.as_tensor(rank_accuracy, dtype=torch.float64)
    if acc.dim() != 2 or acc.numel() == 0:
        raise ValueError(f"auto_choices: rank_accuracy must be [K, R] with K, R >= 1, "
                         f"got {tuple(acc.shape)}")
    if not bool(((acc >= 0) & (acc <= 1)).all()):
        raise ValueError("auto_choices: rank_accuracy holds probabilities, in [0, 1]")
    if max_nodes < 1:
        raise ValueError(f"auto_choices: max_nodes must be >= 1, got {max_nodes}")
    table = acc.tolist()
    depths, ranks = len(table), len(table[0])
    # Best-first over a heap of (-probability, path): the path tuple breaks ties, so the order
    # (and the returned tree) is deterministic.
    heap = [(-table[0][r], (r,)) for r in range(ranks)]
    heapq.heapify(heap)
    order: list[Path] = []
    probs: list[float] = []
    while heap and len(order) < max_nodes:
        neg_prob, path = heapq.heappop(heap)
        order.append(path)
        probs.append(-neg_prob)
        if len(path) < depths:
            for r in range(ranks):
                heapq.heappush(heap, (neg_prob * table[len(path)][r], path + (r,)))
    return order, probs


def dynamic_tree(logprobs: Tensor, ids: Tensor, budget: int) -> tuple[Tensor, Tensor]:
    """Per row, the ``budget`` paths of head ranks with the highest cumulative log-probability.

    A path of ranks (r1, ..., rd) stands for the tokens ``ids[:, 0, r1], ..., ids[:, d-1, rd]``
    and scores ``logprobs[:, 0, r1] + ... + logprobs[:, d-1, rd]``. Log-probabilities are
    <= 0, so a path never scores above its parent and the best paths form a tree under the
    root; among equal scores the shallower path wins, so a parent always precedes its children.
    Rows get trees of different shapes.

    Args:
        logprobs: ``[B, K, k]`` float: the heads' log-probabilities of their top-k candidates
            (K heads, one per depth; values > 0 raise on CPU).
        ids: ``[B, K, k]`` int64 or int32: those candidates' token ids.
        budget: number of nodes under the root; when it exceeds the ``k + k^2 + ... + k^K``
            paths, the last nodes are padding (token -1, parent 0).

    Returns:
        ``(tokens [B, 1 + budget], parents [B, 1 + budget])`` in the dtype of ``ids``: the
        nodes best first (so parents first); ``tokens[:, 0]`` is -1, for the caller to set to
        the root.

    Example:
        >>> logprobs = torch.tensor([[[-0.1, -2.0], [-0.5, -1.0]]]).log_softmax(-1)
        >>> ids = torch.tensor([[[10, 11], [20, 21]]])
        >>> tokens, parents = dynamic_tree(logprobs, ids, 3)
        >>> tokens.tolist(), parents.tolist()
        ([[-1, 10, 20, 21]], [[-1, 0, 1, 1]])
    """
    if logprobs.dim() != 3 or ids.shape != logprobs.shape:
        raise ValueError(f"dynamic_tree: expected logprobs and ids [B, K, k], got "
                         f"{tuple(logprobs.shape)} and {tuple(ids.shape)}")
    if not logprobs.is_floating_point() or ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"dynamic_tree: logprobs must be float and ids int64/int32, got "
                        f"{logprobs.dtype} and {ids.dtype}")
    if budget < 1:
        raise ValueError(f"dynamic_tree: budget must be >= 1, got {budget}")
    # Checked only on CPU: on CUDA it would cost a host synchronisation every step.
    if logprobs.device.type == "cpu" and bool((logprobs > 0).any()):
        raise ValueError("dynamic_tree: logprobs must be <= 0 (log-probabilities)")
    B, K, k = logprobs.shape
    device = logprobs.device

    # Depth by depth, keep only the `budget` best paths: a path in the overall best `budget` is
    # among the best `budget` of its depth, and its parent is too (it scores at least as much and
    # is shallower), so nothing is lost, and the work is K * budget * k rather than k^K. Ties
    # are broken by position (stable sorts), the same here as in the final sort below.
    # Per depth, the kept paths [B, n_d] best first; a parent is the index of the parent path in
    # the concatenation of all depths' kept paths (-1: the root).
    scores: list[Tensor] = []
    tokens: list[Tensor] = []
    parents: list[Tensor] = []
    level_scores = logprobs[:, 0]
    level_tokens = ids[:, 0]
    level_parents = torch.full((B, k), -1, dtype=torch.int64, device=device)
    offset = 0  # where depth d's kept paths start in that concatenation
    for d in range(K):
        keep = min(budget, level_scores.shape[1])
        level_scores, order = level_scores.sort(dim=1, descending=True, stable=True)
        level_scores, order = level_scores[:, :keep], order[:, :keep]
        scores.append(level_scores)
        tokens.append(level_tokens.gather(1, order))
        parents.append(level_parents.gather(1, order))
        if d + 1 < K:
            # Children of the kept paths, parent-major: child j * k + r extends kept path j.
            level_scores = (level_scores.unsqueeze(2) + logprobs[:, d + 1].unsqueeze(1)).flatten(1)
            level_tokens = ids[:, d + 1].unsqueeze(1).expand(B, keep, k).flatten(1)
            kept = torch.arange(keep, device=device) + offset
            level_parents = kept.repeat_interleave(k).expand(B, keep * k)
            offset += keep

    all_scores, all_tokens, all_parents = (torch.cat(x, dim=1) for x in (scores, tokens, parents))
    nodes = min(budget, all_scores.shape[1])
    # Stable: among equal scores the earlier (shallower) path, so every parent precedes its
    # children in the result.
    best = all_scores.sort(dim=1, descending=True, stable=True).indices[:, :nodes]
    # Node number (1-based; 0 is the root) of every kept path that was chosen.
    node_of = torch.zeros_like(all_parents)
    node_of.scatter_(1, best, torch.arange(1, nodes + 1, device=device).expand(B, nodes))
    chosen_parents = all_parents.gather(1, best)
    tree_parents = node_of.gather(1, chosen_parents.clamp(min=0)).masked_fill(chosen_parents < 0, 0)

    out_tokens = ids.new_full((B, 1 + budget), -1)
    out_parents = ids.new_zeros((B, 1 + budget))
    out_tokens[:, 1:nodes + 1] = all_tokens.gather(1, best)
    out_parents[:, 1:nodes + 1] = tree_parents.to(ids.dtype)
    out_parents[:, 0] = -1
    return out_tokens, out_parents
