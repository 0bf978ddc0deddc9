"""How many candidates to verify: expected accepted tokens per unit of time.

On a GPU a target pass over a few dozen tokens costs about what a one-token pass does; on a CPU
it grows with the number of tokens (docs/benchmarks.md), so the best draft length depends on
the measured pass costs and on the recent acceptance, not on a constant.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CostModel:
    """Pass costs (ms) of the target over k tokens, from `specdec.profile_passes` and/or
    measured during decoding, and the draft's cost per drafted token."""

    target_ms: dict[int, float] = field(default_factory=dict)
    draft_ms_per_token: float = 0.0
    smoothing: float = 0.2  # weight of a new measurement

    def observe_target(self, k: int, ms: float) -> None:
        old = self.target_ms.get(k)
        self.target_ms[k] = ms if old is None else (1 - self.smoothing) * old + self.smoothing * ms

    def observe_draft(self, ms_per_token: float) -> None:
        old = self.draft_ms_per_token
        self.draft_ms_per_token = ms_per_token if old == 0 else (
            (1 - self.smoothing) * old + self.smoothing * ms_per_token)

    def target(self, k: int) -> float:
        """Cost of a target pass over k tokens: piecewise-linear in the known points, flat
        beyond them (1.0 for every k when nothing is known)."""
        if not self.target_ms:
            return 1.0
        ks = sorted(self.target_ms)
        if k <= ks[0]:
            return self.target_ms[ks[0]]
        if k >= ks[-1]:
            return self.target_ms[ks[-1]]
        hi = next(i for i in ks if i >= k)
        lo = max(i for i in ks if i <= k)
        if hi == lo:
            return self.target_ms[lo]
        t = (k - lo) / (hi - lo)
        return (1 - t) * self.target_ms[lo] + t * self.target_ms[hi]

    def best_length(self, acceptance: float, max_len: int) -> int:
        """Number of chain candidates maximising expected emitted tokens per ms, for a
        per-token acceptance probability ``acceptance``.

        Example:
            >>> flat = CostModel({1: 10.0, 16: 10.0})
            >>> flat.best_length(0.8, 8)
            8
            >>> steep = CostModel({1: 10.0, 2: 30.0, 16: 300.0})
            >>> steep.best_length(0.5, 8)
            0
        """
        a = min(max(acceptance, 0.0), 0.999)

        def rate(g: int) -> float:
            expected = (1 - a ** (g + 1)) / (1 - a)  # accepted drafts + the one more token
            return expected / (g * self.draft_ms_per_token + self.target(g + 1))

        return max(range(max_len + 1), key=rate)


@dataclass
class AcceptanceEstimate:
    """Running estimate of the probability that a candidate is accepted, given its parent was."""

    value: float = 0.6
    smoothing: float = 0.3

    def observe(self, accepted: int, trials: int) -> None:
        if trials > 0:
            self.value = (1 - self.smoothing) * self.value + self.smoothing * accepted / trials
