"""N-gram drafting: prompt lookup (``ngram_match``) and the lookahead n-gram pool's tables."""

from __future__ import annotations

import torch
from torch import Tensor

from specdec.ops.checks import size_or_one

_ops = torch.ops.specdec


def ngram_match(
    context: Tensor,
    context_len: Tensor | None = None,
    min_n: int = 1,
    max_n: int = 3,
    k: int = 10,
    earliest: bool = False,
) -> tuple[Tensor, Tensor]:
    """Prompt lookup: draft tokens copied from the context where its suffix occurred before.

    For each row, with ``L = context_len[b]``: the longest ``n`` in ``[min_n, max_n]`` for which
    the suffix ``context[b, L-n:L]`` occurs earlier (starting before ``L - n``; the occurrence
    may overlap the suffix), and of its occurrences the most recent one (the latest start
    ``p``; with ``earliest=True`` the first one, the choice of HF's prompt lookup). The draft is
    its continuation ``context[b, p+n : min(p+n+k, L)]``.

    Args:
        context: ``[B, S]`` token ids (int64 or int32); positions from ``context_len`` on are
            not read.
        context_len: ``[B]`` valid length of each row, in ``[0, S]`` (default: S).
        min_n, max_n: the n-gram lengths tried, longest first (``1 <= min_n <= max_n``).
        k: most draft tokens per row (the size of ``draft``).

    Returns:
        ``(draft [B, k], draft_len [B])``: ``draft_len[b]`` tokens, then -1 (``draft_len`` 0
        when nothing matches).

    Example:
        >>> ctx = torch.tensor([[7, 1, 2, 3, 9, 1, 2, 4, 5, 1, 2]])
        >>> draft, n = ngram_match(ctx, min_n=1, max_n=3, k=3)   # suffix [1, 2]: latest at 5
        >>> draft.tolist(), n.tolist()
        ([[4, 5, 1]], [3])
        >>> ngram_match(ctx, min_n=1, max_n=3, k=3, earliest=True)[0].tolist()   # at 1
        [[3, 9, 1]]
    """
    if k < 1:
        raise ValueError(f"specdec.ngram_match: k must be >= 1, got {k}")
    B, S = size_or_one(context, 0), size_or_one(context, 1)
    if context_len is None:
        context_len = torch.full((B,), S, dtype=context.dtype, device=context.device)
    draft = context.new_empty((B, k))
    draft_len = context.new_empty((B,))
    _ops.ngram_match(context, context_len, min_n, max_n, earliest, draft=draft, draft_len=draft_len)
    return draft, draft_len


def ngram_pool_insert(head: Tensor, entries: Tensor, cursor: Tensor, ngrams: Tensor, g: int) -> None:
    """Inserts n-grams into the n-gram pools of B rows, in place (see :class:`specdec.ops.NGramPool`).

    The pool of a row keeps, for each key token, at most ``g`` distinct continuations (the
    n-gram without its first token), the most recently written first. The n-grams of a row
    are written in order ``m = 0 .. M-1``; one that is already there is refreshed (it becomes
    the most recent) rather than stored twice; a new one past ``g`` evicts the key's oldest.
    The row's pool holds at most its last ``C`` writes: write number ``t`` goes to slot
    ``t % C`` and evicts what that slot held. N-grams containing -1 (padding) are skipped.

    Args:
        head: ``[B, V]`` slot of each key's most recent entry, -1 when none (updated in place).
        entries: ``[B, C, N + 1]``: per slot the n-gram (key -1: free slot), then the slot of
            the key's next older entry, -1 at the end (updated in place).
        cursor: ``[B]`` the slot of each row's next write (updated in place).
        ngrams: ``[B, M, N]`` n-grams to insert; each id in ``[0, V)`` or -1.
        g: most continuations per key (use one ``g`` per pool).

    Example:
        >>> head = torch.full((1, 10), -1); entries = torch.full((1, 8, 4), -1)
        >>> cursor = torch.zeros(1, dtype=torch.int64)
        >>> ngram_pool_insert(head, entries, cursor, torch.tensor([[[3, 4, 5], [3, 6, 7]]]), 2)
        >>> ngram_pool_lookup(head, entries, torch.tensor([3]), 2)[0].tolist()
        [[[6, 7], [4, 5]]]
    """
    _ops.ngram_pool_insert(head, entries, cursor, ngrams, g)


def ngram_pool_lookup(
    head: Tensor, entries: Tensor, last_ids: Tensor, g: int
) -> tuple[Tensor, Tensor]:
    """The continuations stored under ``last_ids[b]`` in each row's n-gram pool.

    Args:
        head, entries: the pool (see :func:`ngram_pool_insert`).
        last_ids: ``[B]`` key token of each row, in ``[0, V)``; -1 looks nothing up.
        g: most candidates returned per row.

    Returns:
        ``(candidates [B, g, N - 1], count [B])``: the ``count[b]`` continuations, most recent
        first, then rows of -1.

    Example:
        >>> head = torch.full((1, 10), -1); entries = torch.full((1, 8, 3), -1)
        >>> cursor = torch.zeros(1, dtype=torch.int64)
        >>> ngram_pool_insert(head, entries, cursor, torch.tensor([[[1, 2], [5, 6], [1, 3]]]), 4)
        >>> cand, n = ngram_pool_lookup(head, entries, torch.tensor([1]), 3)
        >>> cand.tolist(), n.tolist()
        ([[[3], [2], [-1]]], [2])
    """
    if g < 1:
        raise ValueError(f"specdec.ngram_pool_lookup: g must be >= 1, got {g}")
    B, N = size_or_one(head, 0), size_or_one(entries, 2) - 1
    candidates = head.new_empty((B, g, max(N - 1, 1)))
    count = head.new_empty((B,))
    _ops.ngram_pool_lookup(head, entries, last_ids, candidates=candidates, count=count)
    return candidates, count
