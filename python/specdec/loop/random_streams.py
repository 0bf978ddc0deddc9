"""Counter-based random numbers: one uniform per (seed, row, position, stream).

A speculative step verifies a proposal whose shape depends on the method and, for adaptive
methods, on measured timings. Drawing that step's random numbers from a sequential generator
would make a seeded run depend on those shapes. Here the uniform that decides the token at
absolute position ``t`` of row ``b`` is a hash of ``(seed, b, t, stream)``: whatever verifies
position ``t`` sees the same number, so a seeded run does not depend on how tokens were grouped
into passes.

The hash is PCG's output permutation (O'Neill) applied in a chain, on 32-bit words kept in
int64 tensors (every product stays below 2**63), so it runs the same on every device.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["RandomStreams"]

_MASK32 = 0xFFFFFFFF
# Streams: which decision a uniform is for.
TOKEN = 0      # the target's token at a position (inverse CDF)
DRAFT = 1      # a stochastic draft's own token at a position
ACCEPT = 2     # accepting the k-th sibling at a position: stream ACCEPT + k (rejection sampling)


def _pcg(x: Tensor) -> Tensor:
    """PCG-RXS-M-XS on 32-bit words (int64 tensor in, int64 tensor of 32-bit values out)."""
    state = (x * 747796405 + 2891336453) & _MASK32
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & _MASK32
    return (word >> 22) ^ word


class RandomStreams:
    """Uniforms in [0, 1) indexed by (row, position, stream), fixed by one seed.

    Example:
        >>> streams = RandomStreams(seed=7)
        >>> a = streams.uniform(torch.tensor([[5, 6, 7]]))
        >>> b = streams.uniform(torch.tensor([[6]]))          # position 6 again, in another shape
        >>> bool(a[0, 1] == b[0, 0]), bool((a >= 0).all() and (a < 1).all())
        (True, True)
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed) & ((1 << 64) - 1)
        self.row_ids: Tensor | None = None  # the batch's rows' own ids (None: 0 .. B - 1)

    def keep_rows(self, rows: Tensor) -> None:
        """The batch keeps only ``rows`` (indices into it): each keeps its own numbers."""
        self.row_ids = rows.clone() if self.row_ids is None else self.row_ids[rows]

    def for_rows(self, ids: Tensor) -> RandomStreams:
        """The same numbers for a batch of the rows ``ids`` (their ids in the whole batch)."""
        out = RandomStreams(self.seed)
        out.row_ids = ids.clone()
        return out

    def join(self, other: RandomStreams) -> None:
        """Appends ``other``'s rows (`for_rows`: rows that join the batch) after this batch's
        ``rows`` (the batch keeps its rows' ids, which ``rows`` numbers when none are set)."""
        if other.seed != self.seed or self.row_ids is None or other.row_ids is None:
            raise ValueError("RandomStreams.join: both need row ids (for_rows) and the same seed")
        self.row_ids = torch.cat([self.row_ids, other.row_ids.to(self.row_ids.device)])

    @classmethod
    def from_generator(cls, generator: torch.Generator | None) -> RandomStreams:
        """A seed drawn from ``generator`` (the global generator when None): one draw, so the
        generator's state decides the whole run."""
        seed = torch.randint(0, 2**62, (1,), generator=generator, device=generator.device if generator else "cpu")
        return cls(int(seed))

    def uniform(self, positions: Tensor, stream: int | Tensor = TOKEN) -> Tensor:
        """float64 uniforms ``[B, T]`` in [0, 1) for absolute ``positions [B, T]`` of rows
        ``0 .. B - 1`` (53 random bits each); ``stream``: an int or ``[B, T]`` ints."""
        B = positions.shape[0]
        rows = (torch.arange(B, device=positions.device) if self.row_ids is None else self.row_ids)
        rows = rows.to(device=positions.device, dtype=torch.int64)[:, None]
        h = _pcg(torch.full_like(positions, self.seed & _MASK32, dtype=torch.int64))
        h = _pcg(h ^ (self.seed >> 32))
        h = _pcg(h ^ rows)
        h = _pcg(h ^ (stream & _MASK32))
        h = _pcg(h ^ (positions.to(torch.int64) & _MASK32))
        lo = _pcg(h ^ 0x9E3779B9)
        bits = ((h >> 11) << 32) | lo  # 21 + 32 bits
        return bits.to(torch.float64) / float(1 << 53)


def sample_inverse_cdf(probs: Tensor, uniform: Tensor) -> Tensor:
    """The token ``x`` with ``cdf(x - 1) <= u * total < cdf(x)`` for each row of ``probs [..., V]``
    and ``uniform [...]`` (cumulative sums in float64): an exact draw, and a token with positive
    probability. Its rank order is the vocabulary's, so equal uniforms give equal tokens for
    equal distributions whatever else shares the call.

    Example:
        >>> sample_inverse_cdf(torch.tensor([[0.5, 0.0, 0.5]]), torch.tensor([0.6])).tolist()
        [2]
    """
    cdf = probs.double().cumsum(-1)
    target = (uniform.double() * cdf[..., -1])[..., None]
    idx = torch.searchsorted(cdf, target, right=True)[..., 0]
    return idx.clamp_max(probs.shape[-1] - 1)
