"""Prompt lookup decoding: candidates copied from earlier in the prompt and output."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdec import ops
from specdec.cost_model import AcceptanceEstimate
from specdec.decoders.base import Context, Proposal


@dataclass
class PromptLookup:
    """Propose the continuation of the most recent earlier occurrence of the context's longest
    suffix n-gram (``max_ngram`` down to ``min_ngram`` tokens), up to ``num_draft_tokens``
    tokens. With ``adaptive=True`` (default) fewer are verified when the recent acceptance and
    the measured pass costs say a longer pass does not pay.

    Example (``model`` a Hugging Face causal LM)::

        out = specdec.generate(model, input_ids, method=specdec.PromptLookup(max_ngram=3))
    """

    max_ngram: int = 3
    min_ngram: int = 1
    num_draft_tokens: int = 10
    adaptive: bool = True
    earliest_branch: bool = True  # also the EARLIEST occurrence's continuation, as a 2nd branch

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")

    @property
    def max_candidates(self) -> int:
        return 1 + self.num_draft_tokens * (2 if self.earliest_branch else 1)

    @property
    def models(self) -> tuple[torch.nn.Module, ...]:
        return ()

    def start(self, target, ctx: Context, prompt: Tensor, prompt_len: Tensor, max_length: int):
        return _LookupProposer(self)


class _LookupProposer:
    def __init__(self, method: PromptLookup) -> None:
        self.method = method
        self.acceptance = AcceptanceEstimate(prior=0.5)
        self.proposed = torch.zeros(0)
        self.steps = 0

    def propose(self, ctx: Context) -> Proposal:
        m = self.method
        k = m.num_draft_tokens
        self.steps += 1
        if m.adaptive:
            # When no candidate pays, still try one now and then so the estimate can recover.
            k = ctx.costs.best_length(self.acceptance, k) or int(self.steps % 8 == 0)
        root = torch.gather(ctx.tokens, 1, (ctx.lengths - 1)[:, None])
        if k == 0:
            self.proposed = torch.zeros_like(ctx.lengths)
            return Proposal(root, torch.full_like(root, -1))
        draft, draft_len = ops.ngram_match(ctx.tokens, ctx.lengths, m.min_ngram, m.max_ngram, k)
        if m.earliest_branch:
            return self._two_branches(ctx, root, draft, draft_len, k)
        width = int(draft_len.max())  # trim to the longest match: no pass over pure padding
        self.proposed = draft_len
        tokens = torch.cat([root, draft[:, :width]], 1)
        parents = torch.arange(-1, width, device=tokens.device).expand_as(tokens)
        return Proposal(tokens, parents)

    def _two_branches(self, ctx: Context, root: Tensor, draft: Tensor, draft_len: Tensor,
                      k: int) -> Proposal:
        """A tree per row: the latest occurrence's continuation and the earliest one's, merged
        where they agree. Which of the two continues the text varies (a repeated line vs the
        original being copied); verifying both costs one pass over a few more tokens."""
        m = self.method
        first, first_len = ops.ngram_match(ctx.tokens, ctx.lengths, m.min_ngram, m.max_ngram, k,
                                           earliest=True)
        tokens, parents = _merge_chains(root, draft, first, first_len)
        self.proposed = torch.maximum(draft_len, first_len)
        return Proposal(tokens, parents)

    def update(self, ctx: Context, proposal: Proposal, accept_len: Tensor) -> None:
        if not self.method.adaptive:  # the estimate costs a host sync: only when it is used
            return
        has = (self.proposed > 0) & ~ctx.finished
        self.acceptance.observe(accept_len[has].tolist(), self.proposed[has].tolist())



def _merge_chains(root: Tensor, a: Tensor, b: Tensor, b_len: Tensor) -> tuple[Tensor, Tensor]:
    """Tokens and parents [B, T] of the tree with root ``root [B, 1]`` and the two chains
    ``a``, ``b`` ([B, k], -1 padded) below it, b sharing a's nodes up to where they differ.
    Nodes are [root, a..., b's own nodes...], padding (-1, under the root) at the end of a row;
    T is the largest node count of a row (one host sync, to size the pass)."""
    B, k = a.shape
    columns = torch.arange(k, device=a.device)
    same = (a == b) & (columns < b_len[:, None])
    shared = same.long().cumprod(1).sum(1, keepdim=True)  # b's leading nodes that are a's
    # b's own node i hangs under a's node `shared` (the root when 0), or under b's node i - 1.
    b_parent = torch.where(columns == shared, shared, k + columns)
    b_own = torch.where(columns >= shared, b, -1)
    tokens = torch.cat([root, a, b_own], 1)
    parents = torch.cat([torch.full_like(root, -1), columns.expand(B, k), b_parent], 1)
    # Drop the padding and renumber: a kept node's new index is the count of kept nodes before it.
    keep = tokens >= 0
    keep[:, 0] = True
    index = keep.long().cumsum(1) - 1
    width = int(keep.sum(1).max())
    slot = torch.where(keep, index, width)  # dropped nodes go to a spare last column
    new_parents = torch.where(parents >= 0, torch.gather(index, 1, parents.clamp_min(0)), -1)
    out_tokens = torch.full((B, width + 1), -1, dtype=tokens.dtype, device=tokens.device)
    out_parents = torch.zeros((B, width + 1), dtype=parents.dtype, device=parents.device)
    out_tokens.scatter_(1, slot, tokens)
    out_parents.scatter_(1, slot, new_parents)
    out_parents[:, 0] = -1
    return out_tokens[:, :width], out_parents[:, :width]
