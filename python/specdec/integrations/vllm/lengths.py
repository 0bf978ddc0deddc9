"""Per-request draft lengths that pay, from what vLLM accepted of the request's recent drafts.

vLLM verifies every draft token it is given, and on a CPU each one costs part of a pass; a
request whose drafts are mostly rejected should propose fewer. Acceptance of a chain is
modelled as geometric: each draft token is accepted with chance ``a`` given that the ones
before it were. From a step that proposed ``d`` tokens of which ``x`` were accepted, ``x``
accepted tokens and (when ``x < d``) one rejection are observed; ``a`` is estimated as
accepted / (accepted + rejections) over recent steps (counts decayed by ``decay`` per
observation). Token ``i`` (1-based) of a draft is accepted with chance ``a ** i``: the draft
is cut where that falls below ``min_gain``.

Example:
    >>> policy = DraftLength(max_tokens=8, min_gain=0.1)
    >>> policy.limit                        # nothing observed yet: the whole draft
    8
    >>> policy.observe(proposed=8, accepted=1)
    >>> policy.limit                        # a = 1/2: 0.5 ** 3 >= 0.1 > 0.5 ** 4
    3
    >>> for _ in range(6): policy.observe(proposed=3, accepted=3)
    >>> policy.limit                        # drafts accepted whole again: back up
    8
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DraftLength"]


@dataclass
class DraftLength:
    """The draft length of one request: at most ``max_tokens``, at least 1."""

    max_tokens: int
    min_gain: float = 0.1
    decay: float = 0.8
    accepted: float = 0.0
    rejections: float = 0.0

    def observe(self, proposed: int, accepted: int) -> None:
        """vLLM accepted ``accepted`` of the ``proposed`` draft tokens of the request's last step."""
        if proposed <= 0:
            return
        self.accepted = self.decay * self.accepted + accepted
        self.rejections = self.decay * self.rejections + (1.0 if accepted < proposed else 0.0)

    @property
    def acceptance(self) -> float:
        """Estimated chance that a draft token is accepted, given its predecessors were (1.0
        before anything was observed)."""
        seen = self.accepted + self.rejections
        return 1.0 if seen == 0 else self.accepted / seen

    @property
    def limit(self) -> int:
        """Most draft tokens worth proposing now."""
        a = self.acceptance
        if a >= 1.0:
            return self.max_tokens
        if a <= 0.0:
            return 1
        return max(1, min(self.max_tokens, math.floor(math.log(self.min_gain) / math.log(a))))
