"""Verification of drafted tokens: chains and trees, greedy and by lossless speculative sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.ops.checks import size_or_one

_ops = torch.ops.specdec


@dataclass(frozen=True)
class TypicalAcceptance:
    """Medusa's typical acceptance: a LOSSY verification mode, used only when asked for.

    A draft token is accepted when the target gives it more probability than
    ``min(posterior_threshold, posterior_alpha * exp(-entropy))`` of the target's distribution
    at that position. Outputs no longer follow the target's distribution exactly.
    """

    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3


def chain_speculative_sampling(
    draft_probs: Tensor | None, draft_ids: Tensor, target_probs: Tensor, uniform: Tensor
) -> tuple[Tensor, Tensor]:
    """Lossless verification of a chain of K drafted tokens per row (speculative sampling).

    Draft ``i`` is accepted while ``uniform[:, i] * q_i(x_i) < p_i(x_i)``. At the first rejection
    the next token is drawn from ``norm(max(0, p_i - q_i))``; when all K are accepted, from
    ``p_K``. The draw uses ``uniform[:, K]``. The emitted tokens are distributed exactly as
    sampling from the target.

    Args:
        draft_probs: ``[B, K, V]`` draft distributions the drafts were sampled from, or ``None``
            for deterministic drafts (q = 1: n-gram, Medusa, greedy drafters).
        draft_ids: ``[B, K]`` drafted token ids (int64 or int32).
        target_probs: ``[B, K + 1, V]`` target distributions (rows sum to 1) at each position.
        uniform: ``[B, K + 1]`` float32 samples from U[0, 1).

    Returns:
        ``(out_ids [B, K + 1], accept_len [B])``: each row holds its ``accept_len`` accepted
        drafts, one sampled token, then -1.

    Example:
        >>> p = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]])
        >>> out, n = chain_speculative_sampling(None, torch.tensor([[1, 2]]), p,
        ...                                     torch.full((1, 3), 0.5))
        >>> out.tolist(), n.tolist()
        ([[1, 2, 0]], [2])
    """
    B, K = size_or_one(draft_ids, 0), size_or_one(draft_ids, 1)
    out_ids = draft_ids.new_empty((B, K + 1))
    accept_len = draft_ids.new_empty((B,))
    _ops.chain_speculative_sampling(
        draft_probs, draft_ids, target_probs, uniform, out_ids=out_ids, accept_len=accept_len
    )
    return out_ids, accept_len


def chain_greedy_verify(draft_ids: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Greedy verification of a chain of K drafted tokens per row.

    Args:
        draft_ids: ``[B, K]`` drafted token ids: in ``[0, V)`` with logits, ``>= 0`` with
            token ids (on CUDA an invalid one is never accepted instead of raising).
        target: the target's greedy tokens ``[B, K + 1]`` (same dtype as ``draft_ids``, each
            ``>= 0``), or its logits ``[B, K + 1, V]`` (the argmax is taken inside, with torch's
            conventions).

    Returns:
        ``(out_ids [B, K + 1], accept_len [B])``: the drafts that equal the target's tokens, the
        target's token at the first mismatch (or after the last draft), then -1.

    Example:
        >>> out, n = chain_greedy_verify(torch.tensor([[5, 7, 9]]), torch.tensor([[5, 7, 2, 4]]))
        >>> out.tolist(), n.tolist()
        ([[5, 7, 2, -1]], [2])
    """
    B, K = size_or_one(draft_ids, 0), size_or_one(draft_ids, 1)
    out_ids = draft_ids.new_empty((B, K + 1))
    accept_len = draft_ids.new_empty((B,))
    _ops.chain_greedy_verify(draft_ids, target, out_ids=out_ids, accept_len=accept_len)
    return out_ids, accept_len


def build_tree(
    parents: Tensor, max_leaves: int | None = None, max_depth: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Attention mask, depths and root-to-leaf paths of token trees.

    Args:
        parents: ``[B, T]``: ``parents[b, 0] == -1`` (node 0 is the root, the last committed
            token) and ``0 <= parents[b, i] < i`` for the other nodes.
        max_leaves, max_depth: size of ``paths`` (default T and T - 1, always enough). Smaller
            values cut: the first ``max_leaves`` leaves, the first ``max_depth + 1`` nodes of a
            path.

    Returns:
        ``(tree_mask [B, T, T] bool, depth [B, T], paths [B, max_leaves, max_depth + 1])``:
        ``tree_mask[b, i, j]`` is true when node j is node i or one of its ancestors; leaves are
        listed in node order, each path from the root, padded with -1 (rows of missing leaves
        are all -1).

    Example:
        >>> mask, depth, paths = build_tree(torch.tensor([[-1, 0, 0, 1]]))
        >>> depth.tolist(), paths.tolist()
        ([[0, 1, 1, 2]], [[[0, 2, -1, -1], [0, 1, 3, -1], [-1, -1, -1, -1], [-1, -1, -1, -1]]])
        >>> mask[0, 3].tolist()
        [True, True, False, True]
    """
    B, T = size_or_one(parents, 0), size_or_one(parents, 1)
    leaves = T if max_leaves is None else max_leaves
    width = T if max_depth is None else max_depth + 1
    tree_mask = torch.empty((B, T, T), dtype=torch.bool, device=parents.device)
    depth = parents.new_empty((B, T))
    paths = parents.new_empty((B, leaves, width))
    _ops.build_tree(parents, tree_mask=tree_mask, depth=depth, paths=paths)
    return tree_mask, depth, paths


def tree_verify_greedy(
    tree_tokens: Tensor, parents: Tensor, target: Tensor, max_accept: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Greedy verification of a token tree per row.

    Accepts the longest root-to-node path whose every token equals the target's greedy token
    at its parent (the lowest node index wins among equally long paths).

    Args:
        tree_tokens: ``[B, T]`` token of every node (node 0, the root, is the last committed
            token and is not checked): in ``[0, V)`` with logits, ``>= 0`` with token ids, or
            -1 for a padding node, which is never accepted.
        parents: ``[B, T]`` the tree (see :func:`build_tree`).
        target: the target's greedy token after every node ``[B, T]`` (each ``>= 0``), or its
            logits ``[B, T, V]``.
        max_accept: most accepted nodes to return (default T - 1, always enough); a longer
            path is cut and its next node's token becomes ``next_token``.

    Returns:
        ``(accept_path [B, max_accept + 1], accept_len [B], next_token [B])``:
        ``accept_path[b, 0] == 0`` (the root), then the accepted nodes in order, then -1. A step
        emits ``tree_tokens[b, accept_path[b, 1:accept_len + 1]]`` followed by ``next_token``.

    Example:
        >>> tokens = torch.tensor([[0, 11, 12, 13]])        # root; 11 and 12 under it; 13 under 11
        >>> parents = torch.tensor([[-1, 0, 0, 1]])
        >>> target = torch.tensor([[11, 13, 40, 50]])       # the target's token after each node
        >>> path, n, nxt = tree_verify_greedy(tokens, parents, target)
        >>> path.tolist(), n.tolist(), nxt.tolist()
        ([[0, 1, 3, -1]], [2], [50])
    """
    B, T = size_or_one(tree_tokens, 0), size_or_one(tree_tokens, 1)
    width = T if max_accept is None else max_accept + 1
    accept_path = tree_tokens.new_empty((B, width))
    accept_len = tree_tokens.new_empty((B,))
    next_token = tree_tokens.new_empty((B,))
    _ops.tree_verify_greedy(
        tree_tokens,
        parents,
        target,
        accept_path=accept_path,
        accept_len=accept_len,
        next_token=next_token,
    )
    return accept_path, accept_len, next_token


def tree_speculative_sampling(
    tree_tokens: Tensor,
    parents: Tensor,
    target_probs: Tensor,
    uniform: Tensor,
    draft_probs: Tensor | None = None,
    typical: TypicalAcceptance | None = None,
    max_accept: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Lossless verification of a token tree per row (multi-branch speculative sampling).

    From the root, a node's children are tried in index order: child c with token x is
    accepted with probability ``min(1, p(x) / q_c(x))`` and the walk descends into it; on
    rejection ``p <- norm(max(0, p - q_c))``. When no child is accepted, the next token is drawn
    from what is left of ``p``. With deterministic drafts (``draft_probs=None``, q = one-hot) a
    rejected token is simply removed from ``p``. The emitted tokens are distributed exactly as
    sampling from the target.

    Args:
        tree_tokens, parents: ``[B, T]`` the tree (see :func:`tree_verify_greedy`).
        target_probs: ``[B, T, V]`` the target's distribution after every node (rows sum to 1).
        uniform: ``[B, T]`` float32 samples from U[0, 1): ``uniform[:, c]`` tests node c,
            ``uniform[:, 0]`` draws the sampled token.
        draft_probs: ``[B, T, V]``: ``draft_probs[:, c]`` is the distribution node c was drawn
            from given its earlier siblings (the draft's distribution when siblings are drawn
            with replacement; that distribution without the earlier siblings' tokens,
            renormalised, when drawn without). ``None``: deterministic drafts.
        typical: use Medusa's LOSSY typical acceptance instead (deterministic drafts only): the
            longest path whose tokens pass the typical test is accepted and the next token is
            drawn from the target at its end.
        max_accept: as in :func:`tree_verify_greedy`.

    Returns:
        ``(accept_path, accept_len, next_token)`` as in :func:`tree_verify_greedy`.

    Example:
        >>> tokens, parents = torch.tensor([[0, 1, 2]]), torch.tensor([[-1, 0, 0]])
        >>> p = torch.tensor([[[0.0, 0.0, 1.0], [0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]])
        >>> path, n, nxt = tree_speculative_sampling(tokens, parents, p, torch.full((1, 3), 0.5))
        >>> path.tolist(), n.tolist(), nxt.tolist()   # node 1 (token 1) has p = 0: node 2 wins
        ([[0, 2, -1]], [1], [0])
    """
    B, T = size_or_one(tree_tokens, 0), size_or_one(tree_tokens, 1)
    width = T if max_accept is None else max_accept + 1
    accept_path = tree_tokens.new_empty((B, width))
    accept_len = tree_tokens.new_empty((B,))
    next_token = tree_tokens.new_empty((B,))
    _ops.tree_speculative_sampling(
        tree_tokens,
        parents,
        target_probs,
        uniform,
        draft_probs,
        typical.posterior_threshold if typical else None,
        typical.posterior_alpha if typical else 0.3,
        accept_path=accept_path,
        accept_len=accept_len,
        next_token=next_token,
    )
    return accept_path, accept_len, next_token
