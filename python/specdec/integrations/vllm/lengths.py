"""How many draft tokens each request proposes inside vLLM: those that raise the engine's
expected tokens per ms.

A vLLM step emits one token per decoding row plus the draft tokens it accepts, and costs what
:class:`~specdec.integrations.vllm.step_cost.StepCost` prices from the engine's own recent steps
(more with any draft, more per draft token). With each draft token's chance of being accepted
together with those before it (:class:`~specdec.integrations.vllm.acceptance.Acceptance`: by
the length of the match that found the draft and the token's position), the proposer picks
per row a length between 0 and its draft's that maximises, for the whole batch,

    (rows + the chances of the proposed tokens) / cost.ms(proposed tokens)

(:func:`best_lengths`). Where a step with drafts costs much more than one without (vLLM on a
CPU), a short or doubtful draft loses and a long likely copy is kept.

A policy that stops proposing stops measuring what it stopped proposing: every
``explore_every``-th step on which the choice cut a draft, every draft goes whole (specdec's own
loop explores the same way, ``EXPLORE_EVERY``), so that the acceptance and the prices keep
following the text and the machine.

Example (prices of vLLM on a CPU: 121 ms a step, 53 ms more with drafts, 13 ms per token):
    >>> cost = StepCost()
    >>> for tokens in (0, 4, 8) * 10:
    ...     cost.observe(tokens, 121.0 + (53.0 + 13.0 * tokens if tokens else 0.0))
    >>> likely = np.cumprod(np.full(8, 0.95))             # a copy after a long match
    >>> doubtful = np.cumprod([0.45, 0.4, 0.4])           # a copy after a short one
    >>> best_lengths([likely], rows=1, cost=cost), best_lengths([doubtful], rows=1, cost=cost)
    (array([8]), array([0]))
    >>> best_lengths([likely, doubtful], rows=2, cost=cost)   # the step carries drafts anyway
    array([8, 1])
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from specdec.integrations.vllm.acceptance import Acceptance
from specdec.integrations.vllm.step_cost import StepCost

__all__ = ["DraftSizer", "best_lengths"]

SHARED_DECAY = 0.98   # per draft verified, of the proposer's acceptance counts (every request's)
REQUEST_DECAY = 0.9   # per draft verified, of a request's own


def best_lengths(gains: list[np.ndarray], rows: int, cost: StepCost) -> np.ndarray:
    """Per row ``r``, how many of its draft tokens to propose: the step's expected tokens per
    ms, ``(rows + sum of the proposed tokens' gains) / cost.ms(proposed tokens)``, at its
    highest. ``gains[r][j]``: the chance that token j of row r's draft is accepted with every
    token before it; it falls with j, so of the drafts with a given number of tokens in all,
    the best takes the largest gains: the tokens are taken in that order, and the best number
    of them (0: no drafts) is chosen."""
    order = sorted((-g, r, j) for r, row in enumerate(gains) for j, g in enumerate(row))
    emitted, best, best_rate = float(rows), 0, rows / cost.ms(0)
    for n, (g, _, _) in enumerate(order, 1):
        emitted -= g
        rate = emitted / cost.ms(n)
        if rate > best_rate:
            best, best_rate = n, rate
    lengths = np.zeros(len(gains), dtype=np.int64)
    for _, r, _ in order[:best]:
        lengths[r] += 1
    return lengths


class DraftSizer:
    """Times vLLM's steps and sizes the drafts of the next one.

    Args:
        keys, positions: the draft keys (match lengths 0 .. keys - 1) and the most draft tokens.
        adaptive: False: every draft is proposed whole.
        explore_every: with ``adaptive``, every this many steps on which drafts were cut, none is.
        timed: False: the steps are priced at ``StepCost``'s prior, never timed (the same drafts
            for the same text whatever the machine's load).
        clock: seconds (``time.perf_counter``; tests pass their own).
    """

    def __init__(self, keys: int, positions: int, adaptive: bool = True, explore_every: int = 8,
                 timed: bool = True, clock: Callable[[], float] = time.perf_counter) -> None:
        self.cost = StepCost()
        self.shared = Acceptance(keys, positions, SHARED_DECAY)
        self.adaptive, self.explore_every, self.timed, self.clock = adaptive, explore_every, timed, clock
        self.cut_steps = 0
        self._called_at: float | None = None
        self._tokens = 0  # draft tokens of the step now running

    def new_request(self) -> Acceptance:
        """A request's own acceptance counts."""
        return Acceptance(self.shared.keys, self.shared.positions, REQUEST_DECAY)

    def step_ended(self, decoded_only: bool) -> None:
        """Called as ``propose`` begins: the time since the last call was one engine step, which
        carried the drafts that call returned; observed when the step only decoded (a prefill
        in it would be priced as drafts)."""
        if not self.timed:
            return
        now = self.clock()
        if self._called_at is not None and decoded_only:
            self.cost.observe(self._tokens, 1000.0 * (now - self._called_at))
        self._called_at = now

    def verified(self, request: Acceptance, key: int, proposed: int, accepted: int) -> None:
        """vLLM accepted ``accepted`` of the ``proposed`` tokens of a request's draft found by ``key``."""
        accepted = min(accepted, proposed)
        request.observe(key, proposed, accepted)
        self.shared.observe(key, proposed, accepted)

    def lengths(self, rows: int, requests: list[Acceptance], keys: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Per batch row, how many of its ``counts[i]`` draft tokens (found by ``keys[i]``) to
        propose, ``rows`` rows decoding; the total is the next step's, for its timing."""
        chosen = counts
        if self.adaptive:
            gains = [request.gains(int(k), self.shared, int(c)) for request, k, c in zip(requests, keys, counts)]
            best = best_lengths(gains, rows, self.cost)
            if (best < counts).any():
                self.cut_steps += 1
                chosen = counts if self.cut_steps % self.explore_every == 0 else best
        self._tokens = int(np.sum(chosen))
        return chosen
