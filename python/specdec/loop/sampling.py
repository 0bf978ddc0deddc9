"""The target's sampling distribution: temperature, top-k and top-p, as `transformers` applies them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen. ``do_sample=False`` is greedy (argmax); otherwise tokens follow the
    target's distribution after temperature, then top-k (0 = off), then top-p (1.0 = off), in the
    order `transformers` applies its warpers."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def probs(self, logits: Tensor) -> Tensor:
        """float32 distribution over the last dim of ``logits``.

        Example:
            >>> Sampling(do_sample=True, top_k=2).probs(torch.tensor([1.0, 3.0, 2.0])).round(decimals=3)
            tensor([0.0000, 0.7310, 0.2690])
        """
        scores = logits.float()
        if self.temperature != 1.0:
            scores = scores / self.temperature
        if 0 < self.top_k < scores.shape[-1]:
            kth = torch.topk(scores, self.top_k, dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p < 1.0:
            # transformers' TopPLogitsWarper: drop the lowest tokens whose cumulative
            # probability stays within 1 - top_p, always keeping the most likely one.
            sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
            cumulative = sorted_scores.softmax(-1).cumsum(-1)
            drop_sorted = cumulative <= 1 - self.top_p
            drop_sorted[..., -1] = False
            drop = drop_sorted.scatter(-1, order, drop_sorted)
            scores = scores.masked_fill(drop, float("-inf"))
        return scores.softmax(-1)
