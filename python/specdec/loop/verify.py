"""How a step's candidates are accepted: greedy, seeded exact sampling, rejection sampling of
stochastic drafts, or (asked for by name) Medusa's lossy typical acceptance.

Sampling uses one uniform per (row, position) (:class:`~specdec.loop.random_streams.RandomStreams`):

- Deterministic candidates (prompt lookup, n-grams, coupled drafts): the target's token at
  position t is the inverse-CDF draw of its distribution there with uniform u(t), and a
  candidate is accepted when it equals that token. The emitted tokens are exactly those that
  ``method=None`` (one token per pass) emits with the same seed, whatever the method and the
  proposal shapes; each is an exact sample of the target's distribution.
- Stochastic drafts (``draft_probs``): ``ops.tree_speculative_sampling`` (recursive rejection
  sampling, lossless), its uniforms keyed by the candidate's position and rank among its
  siblings; reproducible for a given proposal shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdec import ops
from specdec.ops import TypicalAcceptance
from specdec.loop.random_streams import ACCEPT, TOKEN, RandomStreams, sample_inverse_cdf
from specdec.loop.sampling import Sampling

__all__ = ["Verifier"]


@dataclass
class Verifier:
    sampling: Sampling
    streams: RandomStreams | None
    typical: TypicalAcceptance | None = None

    def __post_init__(self) -> None:
        if self.typical is not None and not self.sampling.do_sample:
            raise ValueError("typical acceptance is a sampling mode (lossy): it needs do_sample=True; "
                             "greedy decoding is exact as it is")
        if self.sampling.do_sample and self.streams is None:
            raise ValueError("sampling needs random streams")

    def choose(self, logits: Tensor, positions: Tensor) -> Tensor:
        """The target's token at ``positions [...]`` from its ``logits [..., V]`` at the
        position before: argmax, or the seeded draw."""
        if not self.sampling.do_sample:
            return logits.argmax(-1)
        return draw(self.sampling.probs(logits), self.streams, positions, TOKEN)

    def verify(self, tokens: Tensor, parents: Tensor, logits: Tensor, positions: Tensor,
               draft_probs: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """``(accept_path, accept_len, next_token)`` for candidates ``tokens [B, T]`` (-1: never
        accepted) at ``positions [B, T]`` with the target's ``logits [B, T, V]``."""
        if not self.sampling.do_sample:
            return ops.tree_verify_greedy(tokens, parents, logits)
        probs = self.sampling.probs(logits)
        if draft_probs is None and self.typical is None:
            target = draw(probs, self.streams, positions + 1, TOKEN)
            return ops.tree_verify_greedy(tokens, parents, target)
        if draft_probs is not None and self.typical is not None:
            raise ValueError("typical acceptance needs deterministic candidates (no draft_probs); "
                             "with a draft model use DraftModel(coupled=True)")
        # uniform[:, c] tests node c (keyed by its position and its rank among its siblings,
        # so siblings never share one); uniform[:, 0] draws the token after the accepted path.
        uniform = self.streams.uniform(positions, ACCEPT + sibling_rank(parents))
        uniform[:, 0] = self.streams.uniform(positions[:, :1] + 1, TOKEN)[:, 0]
        return ops.tree_speculative_sampling(tokens, parents, probs, uniform.float().clamp_max(1 - 2**-24),
                                             draft_probs, self.typical)


def draw(probs: Tensor, streams: RandomStreams, positions: Tensor, stream: int) -> Tensor:
    """Inverse-CDF draws from ``probs [B, ..., V]`` with the uniforms of ``positions [B, ...]``."""
    B = positions.shape[0]
    u = streams.uniform(positions.reshape(B, -1), stream).reshape(positions.shape)
    return sample_inverse_cdf(probs, u)


def sibling_rank(parents: Tensor) -> Tensor:
    """``[B, T]`` how many earlier nodes share each node's parent."""
    T = parents.shape[1]
    earlier = torch.ones(T, T, dtype=torch.bool, device=parents.device).tril(-1)
    same = parents[:, :, None] == parents[:, None, :]
    return (same & earlier).sum(-1)

