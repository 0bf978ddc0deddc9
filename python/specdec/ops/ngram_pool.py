"""The n-gram pool of lookahead decoding: per row, recent n-grams indexed by their first token.

The state is three tensors on the model's device, updated in place by the compiled ops
(:func:`specdec.ops.ngram_pool_insert`, :func:`specdec.ops.ngram_pool_lookup`); see docs/ops.md
for the layout. Memory per row: ``V + C * (N + 1) + 1`` index elements, e.g. about 4.2 MiB in
int64 (2.1 MiB in int32) for a 151,936-token vocabulary, N = 5 and the default C = 65,536,
whatever G is (a dense ``[V, G, N - 1]`` table would take 70 MiB in int64 at G = 15).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from specdec import ops

__all__ = ["NGramPool"]


class NGramPool:
    """Recent n-grams of ``batch`` rows, up to ``g`` distinct continuations per key token.

    Each row keeps, for every key token, the ``g`` most recently inserted distinct
    continuations (the n-gram's other ``n - 1`` tokens) among its last ``capacity`` inserts.
    Inserting an n-gram that is already there refreshes it (it becomes the most recent).
    N-grams containing -1 (padding) are skipped, so ragged rows can be padded with -1.

    Args:
        batch: number of rows (independent pools).
        vocab: vocabulary size V (key tokens are in ``[0, V)``).
        n: n-gram length N (>= 2): a key token and ``n - 1`` continuation tokens.
        g: most continuations kept and returned per key.
        device: where the state lives (the model's device).
        capacity: per-row ring of write slots C: an n-gram leaves the pool at the latest
            ``capacity`` inserts after it was last written.
        dtype: index dtype of the state and of the returned candidates (int64 or int32).

    Example:
        >>> pool = NGramPool(batch=2, vocab=100, n=3, g=2)
        >>> tokens = torch.tensor([[5, 6, 7, 5, 6, 8], [1, 2, 3, 4, -1, -1]])
        >>> pool.insert(tokens.unfold(1, 3, 1))    # every 3-gram of each row
        >>> cand, count = pool.lookup(torch.tensor([5, 1]))
        >>> cand.tolist(), count.tolist()
        ([[[6, 8], [6, 7]], [[2, 3], [-1, -1]]], [2, 1])
    """

    DEFAULT_CAPACITY = 1 << 16

    def __init__(
        self,
        batch: int,
        vocab: int,
        n: int,
        g: int,
        device: torch.device | str | None = None,
        *,
        capacity: int = DEFAULT_CAPACITY,
        dtype: torch.dtype = torch.int64,
    ) -> None:
        if batch < 0 or vocab < 1 or n < 2 or g < 1 or capacity < 1:
            raise ValueError(
                "NGramPool needs batch >= 0, vocab >= 1, n >= 2, g >= 1 and capacity >= 1; got "
                f"batch={batch}, vocab={vocab}, n={n}, g={g}, capacity={capacity}"
            )
        if dtype not in (torch.int64, torch.int32):
            raise TypeError(f"NGramPool: dtype must be torch.int64 or torch.int32, got {dtype}")
        self.n, self.g = n, g
        self.head = torch.full((batch, vocab), -1, dtype=dtype, device=device)
        self.entries = torch.full((batch, capacity, n + 1), -1, dtype=dtype, device=device)
        self.cursor = torch.zeros(batch, dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        """Memory held by the state, in bytes."""
        return sum(t.numel() * t.element_size() for t in (self.head, self.entries, self.cursor))

    def keep_rows(self, rows: Tensor) -> None:
        """The batch keeps only ``rows`` (indices into it, in their new order)."""
        self.head, self.entries, self.cursor = self.head[rows], self.entries[rows], self.cursor[rows]

    def join(self, other: NGramPool) -> None:
        """Appends ``other``'s rows (pools of the same sizes: rows that join the batch)."""
        self.head = torch.cat([self.head, other.head])
        self.entries = torch.cat([self.entries, other.entries])
        self.cursor = torch.cat([self.cursor, other.cursor])

    def insert(self, ngrams: Tensor) -> None:
        """Inserts ``ngrams [batch, M, n]`` (any index dtype), row by row in order m = 0..M-1."""
        ops.ngram_pool_insert(self.head, self.entries, self.cursor, ngrams.to(self.head.dtype), self.g)

    def lookup(self, last_ids: Tensor) -> tuple[Tensor, Tensor]:
        """``(candidates [batch, g, n - 1], count [batch])`` of the key ``last_ids[b]`` of each
        row (-1: none), most recent first, padded with -1."""
        return ops.ngram_pool_lookup(self.head, self.entries, last_ids.to(self.head.dtype), self.g)

    def reset(self, rows: Tensor | Sequence[int] | None = None) -> None:
        """Empties the pools of ``rows`` (indices or a bool mask; default: every row).

        Example:
            >>> pool = NGramPool(batch=2, vocab=10, n=2, g=1)
            >>> pool.insert(torch.tensor([[[1, 2]], [[1, 3]]]))
            >>> pool.reset([0])
            >>> pool.lookup(torch.tensor([1, 1]))[1].tolist()
            [0, 1]
        """
        index = slice(None) if rows is None else torch.as_tensor(rows, device=self.head.device)
        self.head[index] = -1
        self.entries[index] = -1
        self.cursor[index] = 0
