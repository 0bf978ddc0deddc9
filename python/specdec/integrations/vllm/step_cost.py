"""The time of one vLLM engine step, fitted online from the intervals between ``propose`` calls.

vLLM calls a ``custom_class`` proposer once per engine step, after sampling, so the interval
between two calls is one step: the target pass over every row and its drafts, verification,
sampling, and the proposer itself. Inside vLLM on a CPU a step that carries any draft costs
markedly more than one that carries none, whatever the drafts' length (docs/benchmarks.md,
"Inside vLLM"), so a step is priced as

    ms = base + drafted * [the step carried draft tokens] + per_token * (draft tokens in the step)

fitted by least squares with forgetting: an observation's weight decays by ``forget`` each step,
so the fit follows the machine as it changes. A weak prior (``prior_weight`` observations' worth)
holds the ratios ``drafted / base`` and ``per_token / base`` at ``PRIOR``'s (a fit of vLLM's CPU
build, Qwen2.5-Coder-0.5B: 53 / 121 and 13 / 121), scaled to the first interval seen: it settles
what the observations leave open (when every step carries drafts, ``base`` and ``drafted`` are
not told apart) and the observations outweigh it within a few steps. Before any interval the
prices are ``PRIOR``'s in arbitrary units, which is enough to compare steps (only ratios of
prices matter to the proposers). An interval above ``OUTLIER`` times its predicted price counts
as that much: a machine's pause must not make drafts look dear for long. (Intervals with a
prefill in them are not observed at all: see ``prompt_lookup.decoded_only``.)

Example:
    >>> cost = StepCost()
    >>> for tokens in (0, 2, 8, 0, 5, 8) * 5:
    ...     cost.observe(tokens, 120.0 + (50.0 + 10.0 * tokens if tokens else 0.0))
    >>> [round(x) for x in (cost.base, cost.drafted, cost.per_token)]
    [120, 50, 10]
    >>> round(cost.ms(0)), round(cost.ms(3))
    (120, 200)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specdec.loop.cost_model import OUTLIER

__all__ = ["PRIOR", "StepCost"]

# (base, drafted, per_token) relative to base: vLLM's CPU build, Qwen2.5-Coder-0.5B fp32, 2 cores.
PRIOR = np.array([1.0, 53.0 / 121.0, 13.0 / 121.0])


def features(tokens: int) -> np.ndarray:
    """The step's regressors: (1, [any draft token], draft tokens)."""
    return np.array([1.0, float(tokens > 0), float(tokens)])


@dataclass
class StepCost:
    """Price in ms of an engine step by its draft tokens, from observed steps."""

    forget: float = 0.97
    prior_weight: float = 0.25
    count: int = 0
    # Decayed sums of x x^T and x * ms over the observed steps, and the prior's coefficients
    # (None until the first interval gives them a scale).
    gram: np.ndarray = field(default_factory=lambda: np.zeros((3, 3)))
    moment: np.ndarray = field(default_factory=lambda: np.zeros(3))
    prior: np.ndarray | None = None
    coef: np.ndarray = field(default_factory=lambda: PRIOR.copy())

    def __post_init__(self) -> None:
        if not 0.0 < self.forget <= 1.0:
            raise ValueError(f"forget must be in (0, 1], got {self.forget}")
        if self.prior_weight <= 0.0:
            raise ValueError(f"prior_weight must be > 0, got {self.prior_weight}")

    @property
    def base(self) -> float:
        """ms of a step without drafts."""
        return float(self.coef[0])

    @property
    def drafted(self) -> float:
        """ms more for a step that carries any draft token (never below 0)."""
        return max(0.0, float(self.coef[1]))

    @property
    def per_token(self) -> float:
        """ms more per draft token (never below 0)."""
        return max(0.0, float(self.coef[2]))

    def ms(self, tokens: int) -> float:
        """Price of a step carrying ``tokens`` draft tokens in all."""
        return self.base + (self.drafted + self.per_token * tokens if tokens > 0 else 0.0)

    def observe(self, tokens: int, ms: float) -> None:
        """A step carrying ``tokens`` draft tokens took ``ms``."""
        x = features(tokens)
        if self.prior is None:
            self.prior = PRIOR * ms / float(PRIOR @ x)
        else:
            ms = min(ms, OUTLIER * self.ms(tokens))
        self.count += 1
        self.gram = self.forget * self.gram + np.outer(x, x)
        self.moment = self.forget * self.moment + x * ms
        ridge = self.prior_weight * np.eye(3)
        self.coef = np.linalg.solve(self.gram + ridge, self.moment + ridge @ self.prior)
