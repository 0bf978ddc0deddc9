"""Prompt planning, with no model: which prefixes rows share, which rows may copy a prefix from
another row's cache, and which rows prefill together. Imports no transformers (the proposer
protocol uses :class:`SharedPrefix`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# What one more pass costs, in prompt tokens: a short pass costs about what prefilling a few
# dozen tokens does on a CPU. A prompt prefix that rows share gets a pass of its own, and rows
# of very different prompt lengths are prefilled apart, only where that spares more than this.
PASS_TOKENS = 64


def length_groups(lengths: Tensor, pass_tokens: int) -> list[Tensor]:
    """Rows ``[B]`` of prompts of ``lengths`` split into groups prefilled in one pass each,
    padded to the group's longest: the split of the rows sorted by length that computes the
    fewest tokens, counting ``pass_tokens`` for each pass (a dynamic program; host-side).

    Example (a long prompt among short ones: padding the short ones to 300 would compute 1200
    tokens, two passes compute 300 + 3 x 40 and cost two passes):
        >>> length_groups(torch.tensor([40, 300, 35, 38]), pass_tokens=64)
        [tensor([1]), tensor([0, 3, 2])]
        >>> length_groups(torch.tensor([40, 50, 35, 38]), pass_tokens=64)
        [tensor([1, 0, 3, 2])]
    """
    order = torch.sort(lengths.cpu(), descending=True, stable=True).indices
    n = lengths.cpu()[order].tolist()
    B = len(n)
    # best[j]: least cost of the first j sorted rows; start[j]: where the last group starts.
    best, start = [0.0] + [float("inf")] * B, [0] * (B + 1)
    for j in range(1, B + 1):
        for i in range(j):  # the group of sorted rows i .. j - 1, padded to n[i]
            cost = best[i] + (j - i) * n[i] + pass_tokens
            if cost < best[j]:
                best[j], start[j] = cost, i
    groups, j = [], B
    while j > 0:
        groups.append(order[start[j]:j])
        j = start[j]
    return groups[::-1]


def prefill_tokens(lengths: Tensor, pass_tokens: int) -> int:
    """Prompt tokens the passes of :func:`prefill` compute for prompts of ``lengths`` (after any
    shared prefix), padding included: each `length_groups` group padded to its longest.

    Example:
        >>> prefill_tokens(torch.tensor([40, 300, 35, 38]), pass_tokens=64)   # 300 + 3 x 40
        420
    """
    lengths = lengths.cpu()
    return sum(len(g) * int(lengths[g].max()) for g in length_groups(lengths, pass_tokens))


@dataclass(frozen=True)
class SharedPrefix:
    """The first ``length`` prompt tokens of ``rows`` (batch indices) are the same."""

    rows: tuple[int, ...]
    length: int


def shared_prefixes(tokens: Tensor, lengths: Tensor, min_saved: int = 0) -> tuple[SharedPrefix, ...]:
    """Groups of rows of right-padded prompts ``tokens [B, N]`` that start alike, chosen to spare
    the most prefill: a group of k rows sharing n tokens spares (k - 1) n and is formed only when
    that is more than ``min_saved`` (what its pass of its own costs, in tokens). The rows are
    sorted by their prompts and split into runs (a dynamic program over the neighbours' common
    lengths); a group's prefix stops one token before its shortest prompt ends (each row keeps
    its last token for its own pass). Host-side, O(B^2) plus the sort."""
    B = tokens.shape[0]
    rows = [tokens[b, : int(n)].tolist() for b, n in enumerate(lengths)]
    order = sorted(range(B), key=rows.__getitem__)

    def common(a: list[int], b: list[int]) -> int:
        n = min(len(a), len(b)) - 1
        return next((i for i in range(n) if a[i] != b[i]), max(n, 0))

    near = [common(rows[a], rows[b]) for a, b in zip(order, order[1:])]
    # best[j]: most tokens spared (net of min_saved per group) by the first j sorted rows;
    # start[j]: where the run ending at sorted row j - 1 starts.
    best, start = [0] * (B + 1), list(range(-1, B))
    for j in range(1, B + 1):
        best[j], start[j], n = best[j - 1], j - 1, None
        for i in range(j - 1, 0, -1):  # the run of sorted rows i - 1 .. j - 1
            n = near[i - 1] if n is None else min(n, near[i - 1])
            if n == 0:
                break
            if best[i - 1] + (j - i) * n - min_saved > best[j]:
                best[j], start[j] = best[i - 1] + (j - i) * n - min_saved, i - 1
    groups, j = [], B
    while j > 0:
        i = start[j]
        if j - i > 1:
            groups.append(SharedPrefix(tuple(sorted(order[i:j])), min(near[i:j - 1])))
        j = i
    return tuple(sorted(groups, key=lambda g: g.rows))


def prefix_donors(tokens: Tensor, lengths: Tensor, donor_tokens: Tensor, donor_lengths: Tensor,
                  min_tokens: int = 1) -> tuple[Tensor, Tensor]:
    """For rows of prompts ``tokens [k, N]`` (right-padded, ``lengths [k]``) joining a batch whose
    rows have the prompts ``donor_tokens [R, M]`` (``donor_lengths [R]``): ``(donor [k], length
    [k])``, the batch row whose prompt starts with the longest common prefix and that prefix's
    length (stopping one token before the joining prompt ends; 0 and donor -1 below
    ``min_tokens``). Its cache entries can be copied instead of computed.

    Example:
        >>> donor, n = prefix_donors(torch.tensor([[5, 6, 7, 8], [9, 9, 0, 0]]), torch.tensor([4, 2]),
        ...                          torch.tensor([[1, 2, 3], [5, 6, 7]]), torch.tensor([3, 3]))
        >>> donor.tolist(), n.tolist()
        ([1, -1], [3, 0])
    """
    k, R = tokens.shape[0], donor_tokens.shape[0]
    if R == 0:
        return torch.full((k,), -1, dtype=torch.int64), torch.zeros(k, dtype=torch.int64)
    width = min(tokens.shape[1], donor_tokens.shape[1])
    columns = torch.arange(width, device=tokens.device)
    same = tokens[:, None, :width] == donor_tokens[None, :, :width].to(tokens.device)
    within = (columns < (lengths[:, None, None] - 1)) & (columns < donor_lengths.to(tokens.device)[None, :, None])
    common = (same & within).long().cumprod(2).sum(2)  # [k, R]
    length, donor = common.max(1)
    use = length >= min_tokens
    return torch.where(use, donor, -1).cpu(), torch.where(use, length, 0).cpu()


def prefix_offsets(groups: Sequence[SharedPrefix], batch: int, device: torch.device | str = "cpu") -> Tensor:
    """``[batch]`` int64: each row's shared prefix length (0 for rows in no group)."""
    offsets = torch.zeros(batch, dtype=torch.int64)
    for group in groups:
        offsets[list(group.rows)] = group.length
    return offsets.to(device)
