"""When speculating does not pay: one token per pass instead.

A batch finishes when its slowest row does. Candidates that only some rows get accepted make
every pass wider (all rows are computed at the batch's widest proposal) without finishing the
batch any sooner: on a CPU, where a pass over 8 rows is already compute-bound, a batch mixing
rows that copy well with rows that do not then decodes slower than one token per pass. So the
loop measures, per step, how far the slowest live row advanced per ms, when the method proposes
and when it is told to propose nothing (``Context.max_nodes = 0``), and keeps whichever is
faster; every few steps it tries the other (one-token steps only while the two are within
``CLEAR_MARGIN``), so that the estimates follow the text. Batches only: one row's methods size
themselves from the pass costs already, and the two early one-token steps would cost them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.cost_model import EXPLORE_EVERY, RunningMean

# Measured steps of each kind before the loop may stop proposing.
MIN_SAMPLES = 2
# Proposing this much faster: one-token steps are not tried again.
CLEAR_MARGIN = 1.5


@dataclass
class Pacing:
    """Chooses, before each step, whether the method proposes (``budget() is None``) or the
    step is one token per row (0), from the measured progress of the slowest live row per ms."""

    speculative: RunningMean = field(default_factory=RunningMean)  # slowest row's tokens per ms
    one_token: RunningMean = field(default_factory=RunningMean)
    steps: int = 0
    proposing: bool = True

    def budget(self) -> int | None:
        self.steps += 1
        s, o, phase = self.speculative, self.one_token, self.steps % EXPLORE_EVERY
        if s.count < MIN_SAMPLES:
            self.proposing = True
        elif o.count < MIN_SAMPLES:  # then as many one-token steps, to compare
            self.proposing = False
        elif s.value >= o.value:  # keep the one-token estimate fresh only while it is close
            self.proposing = phase != EXPLORE_EVERY // 2 or s.value > CLEAR_MARGIN * o.value
        else:
            self.proposing = phase == 0
        return None if self.proposing else 0

    def observe(self, slowest_progress: int, ms: float) -> None:
        """The step just run: the fewest tokens a live row emitted, and its wall time."""
        (self.speculative if self.proposing else self.one_token).observe(slowest_progress / max(ms, 1e-6))
