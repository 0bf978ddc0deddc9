"""How likely each token of a draft is accepted, by the length of the match that found the draft
and the token's position in it.

A copy found after a 3-token match is likelier right than one found after 2 tokens, and a copy
tends to be accepted whole or not at all (the chance that token i is accepted, given that the
tokens before it were, rises with i), so one rate per request misjudges copies. Rates are kept
per (key, position), the key being the length of the matched context suffix (0: a draft found
without a copy, Lookahead's pool), as decayed counts: ``tried[key, i]``, how often verification
reached position i (every token before it accepted), and ``passed[key, i]``, how often it
accepted it there; each observation first decays every count by ``decay``.

A request's own counts are few, so its rates lean on the proposer's (every request's, decayed
more slowly) by ``LEAN`` pseudo-observations; the proposer's lean on ``FIRST`` at position 0 and
on their own rate at position i - 1 beyond (deeper positions, reached less often, start where
the shallower ones are).

Example:
    >>> shared = Acceptance(keys=4, positions=4, decay=0.98)
    >>> request = Acceptance(keys=4, positions=4, decay=0.9)
    >>> for _ in range(10):
    ...     for table in (shared, request):
    ...         table.observe(key=3, proposed=4, accepted=4)   # after 3 matching tokens: taken whole
    ...         table.observe(key=2, proposed=4, accepted=1)   # after 2: the second token rejected
    >>> request.gains(3, shared, count=4).round(2)             # chance each token is accepted
    array([0.97, 0.97, 0.97, 0.97])
    >>> request.gains(2, shared, count=4).round(2)
    array([0.98, 0.05, 0.01, 0.  ])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Acceptance"]

FIRST = 0.6  # the chance assumed for a draft's first token before any was verified
LEAN = 2.0   # pseudo-observations of a rate's prior


@dataclass
class Acceptance:
    """Decayed acceptance counts per (key 0 .. keys - 1, position 0 .. positions - 1)."""

    keys: int
    positions: int
    decay: float
    passed: np.ndarray = field(init=False)
    tried: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")
        self.passed = np.zeros((self.keys, self.positions))
        self.tried = np.zeros((self.keys, self.positions))

    def observe(self, key: int, proposed: int, accepted: int) -> None:
        """Verification accepted ``accepted`` of the ``proposed`` tokens of a draft found by ``key``."""
        if proposed <= 0:
            return
        self.passed *= self.decay
        self.tried *= self.decay
        i = np.arange(proposed)
        self.tried[key, :proposed] += i <= accepted
        self.passed[key, :proposed] += i < accepted

    def rates(self, key: int, prior: np.ndarray | None = None) -> np.ndarray:
        """Per position, the chance that its token is accepted given that those before it were:
        the counts, leaning on ``prior`` (per position), or without one on ``FIRST`` at
        position 0 and on the rate at the position before beyond."""
        if prior is not None:
            return (self.passed[key] + LEAN * prior) / (self.tried[key] + LEAN)
        out = np.empty(self.positions)
        before = FIRST
        for i in range(self.positions):
            before = out[i] = (self.passed[key, i] + LEAN * before) / (self.tried[key, i] + LEAN)
        return out

    def gains(self, key: int, shared: Acceptance, count: int) -> np.ndarray:
        """Chance that each of the first ``count`` tokens of a draft found by ``key`` is accepted
        (with every token before it): this table's rates leaning on ``shared``'s."""
        return np.cumprod(self.rates(key, shared.rates(key))[:count])
