"""When speculating does not pay: one token per pass instead.

A batch finishes when its last row does. Candidates that only some rows get accepted make
every pass wider (all rows are computed at the batch's widest proposal) without finishing the
batch any sooner: on a CPU, where a pass over 8 rows is already compute-bound, a batch mixing
rows that copy well with rows that do not then decodes slower than one token per pass. So the
loop measures, per step, how far the batch's laggard advanced per ms (the fewest tokens any row
still going has emitted), when the method proposes and when it is told to propose nothing
(``Context.max_nodes = 0``), and keeps whichever is faster; every few steps it tries the other
(one-token steps only while the two are within ``CLEAR_MARGIN``), so that the estimates follow
the text. Batches only: one row's methods size themselves from the pass costs already, and the
two early one-token steps would cost them.

The laggard's progress is counted on the emitted totals, not as the fewest tokens a row emitted
in the step: rows that copy at different steps (one takes 8 tokens while the other takes 1, then
the other way round) advance the batch by 9 over the two steps, not by 2. One-token steps never
open such gaps, so the catching up is credited to the steps that propose. For the same reason
each estimate is tokens over time of the recent steps of its kind (a ratio of running means),
not a mean of per-step rates, which a step that catches up 8 tokens would move as much as a
step of 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from specdec.loop.cost_model import CLEAR_MARGIN, EXPLORE_EVERY, Throughput

# Measured steps of each kind before the loop may stop proposing.
MIN_SAMPLES = 2
_NONE_GOING = 1 << 62


def laggard(generated: Tensor, going: Tensor) -> Tensor:
    """The fewest tokens ``generated [B]`` among the rows ``going [B]`` (a huge value when none
    is), as a 0-d tensor (no host read)."""
    return torch.where(going, generated, _NONE_GOING).min()


@dataclass
class Pacing:
    """Chooses, before each step, whether the method proposes (``budget() is None``) or the
    step is one token per row (0), from the measured progress of the batch's laggard per ms.

    Example: two rows that copy at alternate steps advance the batch 9 tokens per two steps
    when proposing (steps of 1.2 ms), one per step without (1 ms): after the two one-token steps
    that measure the alternative, it keeps proposing.

        >>> pacing, generated = Pacing(), torch.zeros(2, dtype=torch.long)
        >>> going = torch.ones(2, dtype=torch.bool)
        >>> budgets = []
        >>> for step in range(24):
        ...     budgets.append(pacing.budget(generated, going))
        ...     if budgets[-1] is None:
        ...         generated += torch.tensor([8, 1] if step % 2 else [1, 8])
        ...     else:
        ...         generated += 1
        ...     pacing.observe(generated, going, 1.2 if budgets[-1] is None else 1.0)
        >>> budgets.count(0), len(budgets)
        (2, 24)
    """

    speculative: Throughput = field(default_factory=Throughput)  # the laggard's tokens per ms
    one_token: Throughput = field(default_factory=Throughput)
    steps: int = 0
    proposing: bool = True
    total: bool = False  # measure the batch's total progress instead of the laggard's
    _before: Tensor | None = None  # the measured tokens when the step began

    def measure_total(self, total: bool) -> None:
        """Whether to measure the batch's total emitted tokens (while requests wait to take
        the places of rows that stop: then throughput finishes the queue sooner, not the
        laggard) or the laggard's; a change starts the estimates afresh."""
        if total != self.total:
            self.total, self.speculative, self.one_token = total, Throughput(), Throughput()

    def _progress(self, generated: Tensor, going: Tensor) -> Tensor:
        return generated.sum() if self.total else laggard(generated, going)

    def budget(self, generated: Tensor, going: Tensor) -> int | None:
        """This step's ``max_nodes`` (None: the method's own sizing), given the tokens each row
        has emitted so far and the rows still going."""
        self._before = self._progress(generated, going)
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

    def observe(self, generated: Tensor, going: Tensor, ms: float) -> None:
        """The step just run (after `budget`): the tokens emitted so far, the rows still going
        and the step's wall time. One host read."""
        before, after = torch.stack([self._before, self._progress(generated, going)]).tolist()
        if after == _NONE_GOING:  # the batch is done
            return
        (self.speculative if self.proposing else self.one_token).observe(after - before, ms)
