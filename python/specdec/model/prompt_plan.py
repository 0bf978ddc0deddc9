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


def _run_bounds(keys: Sequence) -> list[int]:
    """Where each run of equal neighbours in ``keys`` starts, then ``len(keys)``.

    Example:
        >>> _run_bounds([5, 5, 3, 3, 3, 1])
        [0, 2, 5, 6]
    """
    return [i for i in range(len(keys)) if i == 0 or keys[i] != keys[i - 1]] + [len(keys)]


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
    # Groups start only where the length changes: a group starting inside a run of equal
    # lengths would do better to take the run's earlier rows (padded less, maybe a pass fewer).
    # So the program runs over the runs (a batch of equal prompts is one), not the rows.
    cuts = _run_bounds(n)
    # best[j]: least cost of the sorted rows before cuts[j]; start[j]: where its last group starts.
    best, start = [0.0] + [float("inf")] * (len(cuts) - 1), [0] * len(cuts)
    for j in range(1, len(cuts)):
        for i in range(j):  # the group of sorted rows cuts[i] .. cuts[j] - 1, padded to n[cuts[i]]
            cost = best[i] + (cuts[j] - cuts[i]) * n[cuts[i]] + pass_tokens
            if cost < best[j]:
                best[j], start[j] = cost, i
    groups, j = [], len(cuts) - 1
    while j > 0:
        groups.append(order[cuts[start[j]]:cuts[j]])
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
    its last token for its own pass). Rows with equal prompts (n samples of one prompt) stay
    together, so the program runs over the distinct prompts: host-side, O(D^2) for D distinct
    prompts, plus the sort.

    Example (rows 0 and 2 share 4 tokens; a group's pass is worth it from 3 spared tokens):
        >>> tokens = torch.tensor([[1, 2, 3, 4, 5, 0], [7, 8, 9, 0, 0, 0], [1, 2, 3, 4, 6, 6]])
        >>> shared_prefixes(tokens, torch.tensor([5, 3, 6]), min_saved=3)
        (SharedPrefix(rows=(0, 2), length=4),)
    """
    B = tokens.shape[0]
    rows = [tuple(tokens[b, : int(n)].tolist()) for b, n in enumerate(lengths)]
    order = sorted(range(B), key=rows.__getitem__)
    # Units: runs of equal prompts in sorted order; units[u] = (first sorted row, end).
    cuts = _run_bounds([rows[o] for o in order])
    units = list(zip(cuts, cuts[1:]))

    def common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
        n = min(len(a), len(b)) - 1
        return next((i for i in range(n) if a[i] != b[i]), max(n, 0))

    # near[u]: common length of units u and u + 1; alone[u]: what a unit's own rows share.
    near = [common(rows[order[a]], rows[order[b]]) for (a, _), (b, _) in zip(units, units[1:])]
    alone = [max(len(rows[order[a]]) - 1, 0) for a, _ in units]
    U = len(units)
    # best[j]: most tokens spared (net of min_saved per group) by the first j units;
    # start[j]: where the run of units ending at unit j - 1 starts.
    best, start = [0] * (U + 1), list(range(-1, U))
    for j in range(1, U + 1):
        best[j], start[j], n = best[j - 1], j - 1, alone[j - 1]
        for i in range(j, 0, -1):  # the run of units i - 1 .. j - 1
            if i < j:
                n = min(n, near[i - 1])
            if n == 0:
                break
            rows_in = units[j - 1][1] - units[i - 1][0]
            if rows_in > 1 and best[i - 1] + (rows_in - 1) * n - min_saved > best[j]:
                best[j], start[j] = best[i - 1] + (rows_in - 1) * n - min_saved, i - 1
    groups, j = [], U
    while j > 0:
        i = start[j]
        first, end = units[i][0], units[j - 1][1]
        if end - first > 1:
            length = min([alone[j - 1], *near[i:j - 1]])
            groups.append(SharedPrefix(tuple(sorted(order[first:end])), length))
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
