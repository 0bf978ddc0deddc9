"""Per-step choice between a method's full shape and the simpler shapes it contains.

A token tree contains its chain, lookahead contains prompt lookup, an ensemble contains each of
its members. Each of those sizes its nodes from the pass-cost model, but that model does not see
all a step costs (a tree's draft passes over several nodes, the window's bookkeeping, the
merging of members' trees), nor whether the extra nodes were accepted more than the simpler
shape's would have been. So the method measures each shape as it runs: the time from one of its
proposals to the next (a whole step: proposing, the target pass, verifying, learning) and the
tokens the step emitted per row; it takes the shape with the most tokens per ms, and tries another
shape every `EXPLORE_EVERY` steps so that the estimates follow the text (generated code
and copied code favour different shapes); a shape measured far slower than the best
(`CLEAR_MARGIN`), less often.

A tree contains its chain, and every method contains one-token decoding: `Eagle`'s shapes end
with "none" (no candidates), since its drafter, unlike a draft model, may predict too little to
pay for any pass over its nodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specdec.loop.cost_model import CLEAR_MARGIN, EXPLORE_EVERY, OUTLIER, Throughput

# Steps each shape is measured on before the choice compares them (one: a run of 128 tokens
# that copies 8 per step has 16 steps, and a measuring step in a shape that does not pay costs
# most of a step; the explorations measure again).
MIN_SAMPLES = 1
# A shape measured more than CLEAR_MARGIN times slower than the best is tried on every this
# many-th of its turns to be explored only.
FAR_EVERY = 4


@dataclass
class ShapeChoice:
    """Measured tokens per ms of each shape (0: the full one), and this step's choice.

    A proposer calls `choose` when it proposes (``budgeted=True`` when the loop or an ensemble
    set its node budget: such a step is not timed and keeps the full shape) and `emitted` when
    its step is verified.

    Example (on a clock that advances only when told: shape 1 emits as many tokens per step in
    less time; steps 4, 12 and 20 try shape 0 again):
        >>> clock = [0.0]
        >>> choice = ShapeChoice(("tree", "chain"), clock=lambda: clock[0])
        >>> picks = []
        >>> for step in range(20):
        ...     shape = choice.choose()
        ...     picks.append(shape)
        ...     clock[0] += (0.14 if shape == 0 else 0.1)
        ...     choice.emitted(torch.tensor([2]), torch.tensor([True]))
        >>> picks[:6], picks[6:]
        ([0, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0])
    """

    shapes: tuple[str, ...]
    clock: Callable[[], float] | None = field(default=None, repr=False)  # None: time.perf_counter
    measured: list[Throughput] = field(default_factory=list)  # per shape
    steps: int = 0
    current: int | None = None    # the shape of the step being timed
    since: float = 0.0            # when it was proposed
    tokens_per_row: float | None = None  # what it emitted, once verified

    def __post_init__(self) -> None:
        self.measured = [Throughput() for _ in self.shapes]

    def choose(self, budgeted: bool = False) -> int:
        """This step's shape; closes the measurement of the step before (its time runs to now)."""
        now = self.clock() if self.clock is not None else time.perf_counter()
        if self.current is not None and self.tokens_per_row is not None:
            measured = self.measured[self.current]
            ms, estimate = (now - self.since) * 1e3, measured.ms.value
            # A step that also prefilled joining rows, or ran on a loaded machine, counts as
            # at most OUTLIER times the estimate (cost_model.OUTLIER).
            measured.observe(self.tokens_per_row, ms if estimate is None else min(ms, OUTLIER * estimate))
        if budgeted:
            self.current = None
            return 0
        self.steps += 1
        untried = [i for i, m in enumerate(self.measured) if m.count < MIN_SAMPLES]
        if untried:
            pick = untried[0]
        else:
            best = max(range(len(self.shapes)), key=lambda i: self.measured[i].value)
            others = [i for i in range(len(self.shapes)) if i != best]
            # Halfway between the steps where the methods' own choices explore (theirs would
            # otherwise be made in a shape that may not contain them).
            pick = best
            if self.steps % EXPLORE_EVERY == EXPLORE_EVERY // 2:
                turn = self.steps // EXPLORE_EVERY
                other = others[turn % len(others)]
                far = self.measured[best].value > CLEAR_MARGIN * self.measured[other].value
                if not far or (turn // len(others)) % FAR_EVERY == 0:
                    pick = other
        self.current, self.since, self.tokens_per_row = pick, now, None
        return pick

    def emitted(self, accept_len: Tensor, live: Tensor) -> None:
        """The step just verified accepted ``accept_len [B]`` candidates per row; ``live [B]``
        the rows that were decoding (one host read)."""
        if self.current is None:
            return
        rows, tokens = torch.stack([live.sum(), ((accept_len + 1) * live).sum()]).tolist()
        if rows:
            self.tokens_per_row = tokens / rows


def choice_for(shapes: tuple[str, ...], adaptive: bool) -> ShapeChoice | None:
    """A `ShapeChoice` among ``shapes``, or None where there is nothing to choose (one shape, or
    a method told to keep its shape: ``adaptive=False``)."""
    return ShapeChoice(shapes) if adaptive and len(shapes) > 1 else None

