"""Per-step choice between a method's full shape and the simpler shapes it contains.

A token tree contains its chain, lookahead contains prompt lookup, and an ensemble contains each
of its members. Each of those sizes its nodes from the pass-cost model, but that model does not
see all a step costs (a tree's draft passes over several nodes, the window's bookkeeping, the
merging of members' trees), nor whether the extra nodes were accepted more than the simpler
shape's would have been. So the method measures each shape as it runs and takes the one with the most tokens per
ms: the mean tokens a step emits per row (its yield) over the mean ms of a whole step (from one
proposal to the next: proposing, the target pass, verifying, learning).

Yields are paired. A step in a shape that contains a simpler one also tells how many tokens the
simpler one would have emitted in that same step: the target's token at each position does not
depend on the other nodes of the pass (greedy, and the seeded draws against deterministic
candidates, which is how every method here is verified), so the simpler shape's nodes would
have been accepted exactly as far as the step's accepted path runs along them. So a shape's
yield is learned from its own steps and from every step of a shape that contains it: on the
same text as the shape it is compared with, step after step, where comparing one step of each
is a coin flip on text whose steps copy many tokens or one. (The simpler shape alone may propose
other nodes than it has within the full one: a chain sized on its own is longer or shorter than
the tree's first choices; an ensemble's member sizes itself for a narrower pass. There the
yield is an estimate; exactness never depends on it.) A shape that a step's shape does not
contain may still be told a lower bound of its yield (`emitted`'s ``bounds``: an ensemble's
lookup member checked against what another member's step committed). A shape's ms come only
from its own steps.

Exploration follows from that. Each shape runs one step at the start, the full one first (its
step also measures the others' yields), then the best shape runs, and every `EXPLORE_EVERY`
steps another is tried in turn. A shape whose yield the best one's steps give (the best
contains it) is tried only to refresh its step time: on the last of every `FAR_EVERY` of its
turns, its measuring step being recent. A shape whose yield they do not give (the full shape
while a simpler one runs) is tried on each of its turns, unless measured over `CLEAR_MARGIN`
times slower than the best: then on the first of every `FAR_EVERY`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specdec.loop.cost_model import CLEAR_MARGIN, EXPLORE_EVERY, OUTLIER, Throughput

# Steps each shape is timed on before the choice compares them (one: a run of 128 tokens that
# copies 8 per step has 16 steps, and a measuring step in a shape that does not pay costs most
# of a step; the explorations measure again).
MIN_SAMPLES = 1
# Shapes whose yield comes with the best one's steps, and shapes measured more than CLEAR_MARGIN
# times slower than the best, are tried on one of every this many of their turns.
FAR_EVERY = 4


@dataclass
class ShapeChoice:
    """Measured tokens per ms of each shape (0: the full one), and this step's choice.

    A proposer calls `choose` when it proposes (``budgeted=True`` when the loop or an ensemble
    set its node budget: such a step is not timed and keeps the full shape) and `emitted` when
    its step is verified, with what the shapes its step contains would have accepted.

    Example (on a clock that advances only when told: a tree step takes 140 ms, a chain step
    100, and the chain within the tree accepts what the chain does, 2 candidates: 3 tokens).
    The steps not in the faster shape: where the tree emits 5 tokens, its steps give the
    chain's yield, and the chain is tried again only at step 28, for its time; where the tree
    emits 3, the chain's steps do not give the tree's, tried at steps 4, 12, 20 and 28:
        >>> clock = [0.0]
        >>> def others(tree_tokens):
        ...     choice, picks = ShapeChoice(("tree", "chain"), clock=lambda: clock[0]), []
        ...     for step in range(30):
        ...         picks.append(choice.choose())
        ...         tree = picks[-1] == 0
        ...         clock[0] += 0.14 if tree else 0.1
        ...         choice.emitted(torch.tensor([tree_tokens - 1 if tree else 2]), torch.tensor([True]),
        ...                        {1: torch.tensor([2])} if tree else None)
        ...     return [step + 1 for step, shape in enumerate(picks) if shape != picks[-1]]
        >>> others(tree_tokens=5), others(tree_tokens=3)
        ([2, 28], [1, 4, 12, 20, 28])
    """

    shapes: tuple[str, ...]
    clock: Callable[[], float] | None = field(default=None, repr=False)  # None: time.perf_counter
    measured: list[Throughput] = field(default_factory=list)  # per shape: yields and own steps' ms
    contains: list[set[int]] = field(default_factory=list)  # per shape: whose yields its last step gave
    steps: int = 0
    current: int | None = None    # the shape of the step being timed
    since: float = 0.0            # when it was proposed
    verified: bool = False        # whether it has emitted tokens (its time is then measured)

    def __post_init__(self) -> None:
        self.measured = [Throughput() for _ in self.shapes]
        self.contains = [set() for _ in self.shapes]

    def choose(self, budgeted: bool = False) -> int:
        """This step's shape; closes the measurement of the step before (its time runs to now)."""
        now = self.clock() if self.clock is not None else time.perf_counter()
        if self.current is not None and self.verified:
            ms, estimate = (now - self.since) * 1e3, self.measured[self.current].ms
            # A step that also prefilled joining rows, or ran on a loaded machine, counts as
            # at most OUTLIER times the estimate (cost_model.OUTLIER).
            estimate.observe(ms if estimate.value is None else min(ms, OUTLIER * estimate.value))
        if budgeted:
            self.current = None
            return 0
        self.steps += 1
        untried = [i for i, m in enumerate(self.measured) if m.ms.count < MIN_SAMPLES]
        pick = untried[0] if untried else self._best_or_explored()
        self.current, self.since, self.verified = pick, now, False
        return pick

    def _best_or_explored(self) -> int:
        """The shape with the most tokens per ms, or on an exploration step another in turn."""
        value = [m.value for m in self.measured]
        best = max(range(len(self.shapes)), key=value.__getitem__)
        # Halfway between the steps where the methods' own choices explore (theirs would
        # otherwise be made in a shape that may not contain them).
        if self.steps % EXPLORE_EVERY != EXPLORE_EVERY // 2:
            return best
        others = [i for i in range(len(self.shapes)) if i != best]
        turn = self.steps // EXPLORE_EVERY
        other = others[turn % len(others)]
        cycle = (turn // len(others)) % FAR_EVERY  # of the other's turns
        if other in self.contains[best]:  # its yield is current: only its time to refresh
            explore = cycle == FAR_EVERY - 1
        elif value[best] > CLEAR_MARGIN * value[other]:
            explore = cycle == 0
        else:
            explore = True
        return other if explore else best

    def emitted(self, accept_len: Tensor, live: Tensor, contained: Mapping[int, Tensor] | None = None,
                bounds: Mapping[int, Tensor] | None = None) -> None:
        """The step just verified accepted ``accept_len [B]`` candidates per row; ``live [B]``
        the rows that were decoding; ``contained``: for shapes (by index) that this step's
        shape contains, how many candidates each would have had accepted ``[B]`` in the same
        step (their yields, not their times). ``bounds``: for shapes it does not contain, at
        least how many ``[B]`` (a lookup's chain checked against the text this step committed,
        which tells nothing past it): taken as their yields too, while their own steps are
        still tried on each of their turns. One host read."""
        if self.current is None:
            return
        contained = dict(contained or {})
        others = {**contained, **(bounds or {})}
        accepted = torch.stack([accept_len.long(), *(c.long() for c in others.values())])
        rows, *tokens = torch.cat([live.sum()[None], ((accepted + 1) * live).sum(1)]).tolist()
        if not rows:
            return
        for shape, total in zip([self.current, *others], tokens):
            self.measured[shape].tokens.observe(total / rows)
        self.contains[self.current] = set(contained)
        self.verified = True


def accepted_within(accept_path: Tensor, nodes: Tensor) -> Tensor:
    """``[B]``: how many of a step's accepted nodes (``accept_path [B, D]``: the root, the
    accepted nodes, then -1) are, from the root on, among ``nodes [B, T]`` (bool): what a shape
    of those nodes alone would have had accepted, given a subtree under the root, or the nodes
    each continuing its parent's chain (a drafter's first choice after its parent).

    Example (nodes 1 and 3 form a chain; the step accepted nodes 1, 3 and 4):
        >>> chain = torch.tensor([[False, True, False, True, False]])
        >>> accepted_within(torch.tensor([[0, 1, 3, 4, -1]]), chain)
        tensor([2])
    """
    path = accept_path[:, 1:]
    inside = torch.gather(nodes, 1, path.clamp_min(0)) & (path >= 0)
    return inside.long().cumprod(1).sum(1)


def choice_for(shapes: tuple[str, ...], adaptive: bool) -> ShapeChoice | None:
    """A `ShapeChoice` among ``shapes``, or None where there is nothing to choose (one shape, or
    a method told to keep its shape: ``adaptive=False``)."""
    return ShapeChoice(shapes) if adaptive and len(shapes) > 1 else None
