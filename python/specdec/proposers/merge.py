"""Trees merged from several candidates: :func:`merge_paths` merges a tree's nodes whose token
paths from the root are equal (several proposers' trees over one root become one trie);
:func:`merge_chains` turns several candidate chains per row into one tree that way."""

from __future__ import annotations

import torch
from torch import Tensor

from specdec import ops


def merge_chains(root: Tensor, chains: Tensor) -> tuple[Tensor, Tensor]:
    """Tokens and parents [B, T] of the tree with root ``root [B, 1]`` and the chains
    ``chains [B, M, k]`` (-1 padded) below it, merged where they share a prefix: a node belongs
    to the first chain with its prefix. Nodes are [root, chain 0's, chain 1's own, ...], padding
    (-1, under the root) at the end of a row; T is the largest node count of a row (one host
    sync, to size the pass)."""
    B, M, k = chains.shape
    # Node (m, i) sits at 1 + m * k + i, below node (m, i - 1) or the root.
    below = torch.arange(k, device=chains.device).expand(M, k) + torch.arange(M, device=chains.device)[:, None] * k
    parents = torch.where(torch.arange(k, device=chains.device) > 0, below, 0).reshape(1, M * k)
    tokens, parents, _ = merge_paths(torch.cat([root, chains.reshape(B, M * k)], 1),
                                     torch.cat([torch.full_like(root, -1), parents.expand(B, -1)], 1))
    return tokens, parents


def merge_paths(tokens: Tensor, parents: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The tree ``tokens, parents [B, N]`` (node 0 the root, a parent before its children, -1
    tokens: padding, dropped) with nodes whose root-to-node token paths are equal merged into
    the first of them, so siblings hold different tokens. Several proposers' trees over one
    root, concatenated, become one trie this way.

    Returns ``(tokens, parents [B, T], index [B, N])``: kept nodes in their original order
    (parents first), padding (-1, under the root) at the end of a row, T the largest node
    count of a row (one host sync); ``index`` is where each input node went (-1: padding).

    Example:
        >>> tokens = torch.tensor([[5, 7, 8, 7, 9, -1]])   # root 5; 7-8 and 7-9 share their 7
        >>> parents = torch.tensor([[-1, 0, 1, 0, 3, 0]])
        >>> merged, parents, index = merge_paths(tokens, parents)
        >>> merged.tolist(), parents.tolist(), index.tolist()
        ([[5, 7, 8, 9]], [[-1, 0, 1, 1]], [[0, 1, 2, 1, 3, -1]])
    """
    B, N = tokens.shape
    real = tokens >= 0
    real[:, 0] = True
    ancestors, depth, _ = ops.build_tree(parents, max_leaves=1, max_depth=0)
    D = int(depth.max()) + 1
    # path[b, n, d]: the token of node n's ancestor at depth d (-1 below n's depth).
    path = torch.full((B, N, D + 1), -1, dtype=tokens.dtype, device=tokens.device)
    slot = torch.where(ancestors, depth[:, None, :].to(torch.long), D)
    path.scatter_(2, slot, tokens[:, None, :].expand(B, N, N))
    same = (path[:, :, None, :D] == path[:, None, :, :D]).all(-1) & real[:, None, :]
    first = same.to(torch.uint8).argmax(2)  # the first node with the same path (itself at worst)
    nodes = torch.arange(N, device=tokens.device)
    own = real & (first == nodes)
    new = own.long().cumsum(1) - 1
    index = torch.where(real, torch.gather(new, 1, first), -1)
    width = int(own.sum(1).max())
    slot = torch.where(own, new, width)  # merged and padding nodes go to a spare last column
    new_parents = torch.where(parents >= 0, torch.gather(index, 1, parents.clamp_min(0)), -1)
    out_tokens = torch.full((B, width + 1), -1, dtype=tokens.dtype, device=tokens.device)
    out_parents = torch.zeros((B, width + 1), dtype=parents.dtype, device=parents.device)
    out_tokens.scatter_(1, slot, tokens)
    out_parents.scatter_(1, slot, new_parents.to(parents.dtype))
    out_parents[:, 0] = -1
    return out_tokens[:, :width], out_parents[:, :width], index
