"""How many candidates to verify: expected accepted tokens per unit of time.

On a GPU a target pass over a few dozen tokens costs about what a one-token pass does; on a CPU
it grows with the number of tokens (docs/benchmarks.md), so the best draft length depends on
the measured pass costs and on the recent acceptance, not on a constant.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# Adaptive choices try what they currently rule out every this many steps, so that the estimates
# behind them stay current (prompt lookup's sides, lookahead's guesses, an ensemble's members,
# the loop's pacing).
EXPLORE_EVERY = 8
# A choice measured this many times better than another tries that other less often (where it
# is clearly worse, trying it costs more than the estimate's freshness is worth).
CLEAR_MARGIN = 1.5

# A pass's time on a shared machine has outliers (other processes, a virtual machine's
# neighbours): one observation counts as at most this many times the current estimate. An
# estimate raised by a single slow pass would otherwise keep that width out of use, and a width
# not used is not measured again (docs/benchmarks.md, "How to benchmark honestly here").
OUTLIER = 1.5


@dataclass
class RunningMean:
    """The mean of the first values, then exponentially smoothed (None before the first).

    Example:
        >>> m = RunningMean()
        >>> for x in (1.0, 3.0, 5.0, 5.0, 5.0, 5.0):
        ...     m.observe(x)
        >>> round(m.value, 2), m.count
        (4.04, 6)
    """

    value: float | None = None
    count: int = 0
    smoothing: float = 0.2  # weight of a new value once the first 1 / smoothing are in

    def observe(self, x: float) -> None:
        self.count += 1
        weight = max(self.smoothing, 1 / self.count)
        self.value = x if self.value is None else (1 - weight) * self.value + weight * x


@dataclass
class Throughput:
    """Tokens per ms of recent steps: running means of each step's tokens and of its ms (a
    ratio of means, not a mean of per-step rates, which one step that catches up many tokens
    would move as much as a step of one). The two may be observed apart (`ShapeChoice` learns a
    shape's tokens from more steps than it times); ``value`` is None until both are.

    Example:
        >>> t = Throughput()
        >>> t.observe(8, 2.0); t.observe(1, 1.0)
        >>> t.count, round(t.value, 2)
        (2, 3.0)
    """

    tokens: RunningMean = field(default_factory=RunningMean)
    ms: RunningMean = field(default_factory=RunningMean)

    @property
    def count(self) -> int:
        return self.tokens.count

    @property
    def value(self) -> float | None:
        if self.tokens.value is None or self.ms.value is None:
            return None
        return self.tokens.value / max(self.ms.value, 1e-6)

    def observe(self, tokens: float, ms: float) -> None:
        self.tokens.observe(tokens)
        self.ms.observe(ms)


@dataclass
class CostModel:
    """Pass costs (ms) of the target by the number of tokens in the pass, from
    `specdec.profile_passes` (one row over k tokens) and/or measured during decoding, and the
    draft's cost per drafting pass (for the whole batch; one pass per drafted token unless the
    draft takes copied tokens).

    ``rows``: the batch size. ``target(k)`` prices a pass of k nodes per row, that is of
    ``rows * k`` tokens: on a CPU a pass costs about what its tokens cost, whatever the rows
    (the linear layers see rows x nodes rows), so a batch of 8 pays for 8 candidates per
    candidate position and proposes only what pays for that. With ``packed`` passes (the verify
    loop's on CPU: each row computes only its own nodes) and ``proposing`` rows (`for_rows`:
    the rows that have candidates this step), the pass is priced as ``rows`` roots plus
    ``proposing * (k - 1)`` candidates instead.

    Measurements are smoothed, a slow one counts as at most ``OUTLIER`` times the estimate, and
    a pass is never priced above a wider one: a shared machine's slow spells do not take a
    width out of use. While a slow spell has left estimates raised (above ``OUTLIER`` times the
    lowest they have been), a measurement far below its estimate (under 1 / ``OUTLIER`` of it)
    ends the spell: it replaces that estimate, and the raised ones go back to their lowest.
    Without this, the widths a spell priced out are no longer used, so no longer measured, and
    the policy would stay small after the spell has gone. (Measurements below a profile that
    nothing raised are smoothed as any others.)

    Example:
        >>> profile = {1: 50.0, 8: 60.0, 32: 200.0}   # one row over k tokens, ms
        >>> round(CostModel(profile).target(4), 1), CostModel(profile, rows=8).target(4)
        (54.3, 200.0)
        >>> round(CostModel(profile).target(48), 1)  # 200 + 16 x (200 - 60) / (32 - 8)
        293.3
    """

    target_ms: dict[int, float] = field(default_factory=dict)
    draft_ms_per_token: float = 0.0
    smoothing: float = 0.2  # weight of a new measurement
    rows: int = 1
    # Nodes per row that others add to the same pass (an ensemble's other members): a proposer
    # sizing its own nodes pays the pass they make together.
    extra: int = 0
    packed: bool = False
    proposing: int | None = None
    # The lowest each estimate of ``target_ms`` has been (what a slow spell's end returns it to).
    lowest_ms: dict[int, float] = field(default_factory=dict)

    def for_rows(self, proposing: int) -> CostModel:
        """The same costs (measurements shared) pricing steps where only ``proposing`` rows have
        candidates; the same model unless passes are ``packed``.

        Example:
            >>> costs = CostModel({8: 70.0, 16: 100.0}, rows=8, packed=True)
            >>> costs.target(2), costs.for_rows(1).target(2), costs.for_rows(1).target(9)
            (100.0, 73.75, 100.0)
        """
        return dataclasses.replace(self, proposing=proposing) if self.packed else self

    def tokens(self, k: int) -> int:
        """Tokens of a pass of k nodes per row (``extra`` more), as priced."""
        if self.packed and self.proposing is not None:
            return self.rows + (k + self.extra - 1) * self.proposing
        return (k + self.extra) * self.rows

    def observe_target(self, k: int, ms: float) -> None:
        """A pass of k nodes per row took ``ms``. The first measurement of a width is taken as
        it is (a price interpolated from other widths may be far off: below the narrowest
        known one it is proportional to the tokens).

        Example (one pass measured slow, at twice the profile):
            >>> costs = CostModel({1: 60.0, 2: 60.0, 8: 74.0})
            >>> costs.observe_target(2, 125.0)
            >>> costs.target_ms[2], costs.target(2)     # 0.8 x 60 + 0.2 x 1.5 x 60
            (66.0, 66.0)
            >>> costs.observe_target(4, 125.0); costs.target(4)   # priced no higher than 8 tokens
            74.0
        """
        self.observe_tokens(k * self.rows, ms)

    def observe_tokens(self, n: int, ms: float) -> None:
        """A pass over n tokens in all (rows and nodes: a packed pass) took ``ms``.

        Example (a slow spell raised the 8- and 16-token estimates; a 16-token pass at the
        normal cost shows it has gone):
            >>> costs = CostModel({1: 100.0, 8: 140.0, 16: 180.0})
            >>> for _ in range(20):
            ...     costs.observe_tokens(8, 900.0); costs.observe_tokens(16, 1200.0)
            >>> round(costs.target_ms[8]), round(costs.target_ms[16])
            (795, 1047)
            >>> costs.observe_tokens(16, 185.0)
            >>> costs.target_ms
            {1: 100.0, 8: 140.0, 16: 185.0}
        """
        old = self.target_ms.get(n)
        far_below = old is not None and ms * OUTLIER < old
        raised = [i for i, value in self.target_ms.items()
                  if far_below and value > OUTLIER * self.lowest_ms.get(i, value)]
        if raised:  # a slow spell has gone
            for i in raised:
                self.target_ms[i] = self.lowest_ms[i]
            self.target_ms[n] = ms
        else:
            self.target_ms[n] = self._smoothed(old, ms)
        self.lowest_ms[n] = min(self.lowest_ms.get(n, self.target_ms[n]), self.target_ms[n],
                                old if old is not None else float("inf"))

    def observe_draft(self, ms_per_token: float) -> None:
        self.draft_ms_per_token = self._smoothed(self.draft_ms_per_token or None, ms_per_token)

    def _smoothed(self, old: float | None, ms: float) -> float:
        if old is None:
            return ms
        return (1 - self.smoothing) * old + self.smoothing * min(ms, OUTLIER * old)

    def target(self, k: int) -> float:
        """Cost of a target pass of k nodes per row (`tokens`): piecewise-linear in
        the known points; above them along the trend from a pass at most half as wide as the
        widest to the widest (never falling), since on a CPU wider passes keep costing more and
        a flat price made nodes added to a long copy look free; proportional to the tokens below
        them (1.0 for every k when nothing is known). Below, the cost is underestimated rather
        than over: a narrower pass then gets tried, measured, and the estimate corrects itself,
        where a flat one would keep every pass as wide as the first measured.

        With one known point there is no trend: a pass one node per row wider is priced as that
        point (so it gets tried and gives the trend its second point), a wider one in proportion
        to its tokens, the most it can cost (a compute-bound pass): a flat price would make a pass
        twice as wide as the measured one look free before anything measured what it costs.

        Example (one pass measured, over 16 tokens):
            >>> costs = CostModel({16: 100.0})
            >>> costs.target(17), costs.target(32), costs.target(4)
            (100.0, 200.0, 25.0)
        """
        if not self.target_ms:
            return 1.0
        k = self.tokens(k)
        ks = sorted(self.target_ms)
        ms, low = {}, float("inf")
        for i in reversed(ks):  # a pass over more tokens never costs less
            low = ms[i] = min(low, self.target_ms[i])
        if k <= ks[0]:
            return ms[ks[0]] * k / ks[0]
        if k >= ks[-1]:
            top = ks[-1]
            ref = max((i for i in ks if 2 * i <= top), default=ks[0])
            if ref == top:  # one point: see above
                return ms[top] if k <= top + self.rows else ms[top] * k / top
            slope = max(0.0, (ms[top] - ms[ref]) / (top - ref))
            return ms[top] + slope * (k - top)
        hi = next(i for i in ks if i >= k)
        lo = max(i for i in ks if i <= k)
        if hi == lo:
            return ms[lo]
        t = (k - lo) / (hi - lo)
        return (1 - t) * ms[lo] + t * ms[hi]

    def best_length(self, acceptance: AcceptanceEstimate, max_len: int) -> int:
        """Number of chain candidates (0..max_len) maximising the expected emitted tokens per ms.

        Example:
            >>> likely = AcceptanceEstimate(prior=0.8)
            >>> CostModel({1: 10.0, 16: 10.0}).best_length(likely, 8)        # flat costs (GPU)
            8
            >>> CostModel({1: 10.0, 2: 30.0, 16: 300.0}).best_length(AcceptanceEstimate(prior=0.5), 8)
            0
        """

        return max(range(max_len + 1), key=lambda g: acceptance.expected(g) / self.step_ms(g))

    def extend_pays(self, drafted: int, expected: float, gain: float, passes: int | None = None,
                    adds: int = 1) -> bool:
        """Whether one more draft pass raises the expected emitted tokens per ms, when
        ``drafted`` candidates are expected to emit ``expected`` tokens and the pass would add
        ``adds`` candidates (one, or more for a draft taking copied tokens) that add ``gain``
        expected tokens (for one candidate: the probability that it and every candidate before
        it are accepted). ``passes``: draft passes so far, when they drafted more than one
        token each (`DraftModel(lookup=...)`); else one per candidate.

        Example (a pass expected to take 6 copied tokens is worth it where one token is not):
            >>> costs = CostModel({1: 100.0, 8: 100.0}, draft_ms_per_token=10.0)
            >>> costs.extend_pays(3, expected=3.4, gain=0.6), costs.extend_pays(3, 3.4, gain=0.2)
            (True, False)
            >>> costs = CostModel({1: 100.0, 16: 250.0}, draft_ms_per_token=30.0)
            >>> costs.extend_pays(8, 8.0, gain=0.9, passes=2), costs.extend_pays(8, 8.0, 5.4, 2, adds=6)
            (False, True)
        """
        passes = drafted if passes is None else passes
        return ((expected + gain) / self.step_ms(drafted + adds, passes + 1)
                > expected / self.step_ms(drafted, passes))

    def step_ms(self, g: int, passes: int | None = None) -> float:
        """Cost of a step with g chain candidates: the draft passes that drafted them (one per
        candidate unless ``passes`` says otherwise) and a target pass over g + 1."""
        return (g if passes is None else passes) * self.draft_ms_per_token + self.target(g + 1)


@dataclass
class AcceptanceEstimate:
    """Running estimate, per chain position i, of the probability that candidate i is accepted
    given that the candidates before it were. One geometric rate would misjudge copied text
    (prompt lookup), which tends to be accepted whole or not at all.

    Example:
        >>> est = AcceptanceEstimate(prior=0.5, smoothing=1.0)
        >>> est.observe(accepted=[0, 4], proposed=[4, 4])   # one row rejects at once, one takes all
        >>> [round(est.rate(i), 2) for i in range(4)], round(est.expected(4), 2)
        ([0.5, 1.0, 1.0, 1.0], 3.0)
    """

    prior: float = 0.6
    smoothing: float = 0.3
    rates: list[float] = field(default_factory=list)

    def rate(self, i: int) -> float:
        if i < len(self.rates):
            return self.rates[i]
        return self.rates[-1] if self.rates else self.prior

    def observe(self, accepted: list[int], proposed: list[int]) -> None:
        """One step's rows: ``accepted[r]`` of ``proposed[r]`` chain candidates were accepted."""
        width = max(proposed, default=0)
        for i in range(width):
            tried = sum(1 for a, p in zip(accepted, proposed) if p > i and a >= i)
            if tried == 0:
                break
            passed = sum(1 for a, p in zip(accepted, proposed) if p > i and a > i)
            while len(self.rates) <= i:
                self.rates.append(self.rate(len(self.rates)))
            self.rates[i] = (1 - self.smoothing) * self.rates[i] + self.smoothing * passed / tried

    def expected(self, g: int) -> float:
        """Expected tokens emitted by a step with g chain candidates (accepted ones + 1)."""
        total, reach = 1.0, 1.0
        for i in range(g):
            reach *= self.rate(i)
            total += reach
        return total
