"""Candidates copied from the context: what followed the EARLIEST earlier occurrence of the
context's longest suffix n-gram (the original being copied), as long as the recent acceptance
and the measured pass costs say pays. Prompt lookup's first chain; lookahead's long copies."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from specdec import ops
from specdec.cost_model import AcceptanceEstimate
from specdec.decoders.protocol import Context


@dataclass
class CopyChain:
    """``propose`` gives this step's chain ``[B, k]`` (-1 padded); ``observe`` after the step
    learns how far it was accepted.

    ``limit``: most candidates; with ``adaptive`` the length maximising expected tokens per ms
    (``CostModel.best_length``), which may be 0 (no chain)."""

    min_ngram: int
    max_ngram: int
    limit: int
    adaptive: bool
    acceptance: AcceptanceEstimate = field(default_factory=lambda: AcceptanceEstimate(prior=0.5))
    chain: Tensor | None = None          # this step's [B, k]
    start: Tensor = field(default_factory=lambda: torch.zeros(0))  # committed lengths then

    def propose(self, ctx: Context, explore: bool = False) -> Tensor | None:
        """The chain, or None when no candidate pays (``explore``: then one candidate anyway,
        so that the estimate can recover) or the context's ``max_nodes`` is 0."""
        k = ctx.node_budget(self.limit)
        self.chain = None
        if k == 0:
            return None
        # The chain of the longest match, cut to the length that pays (a cut chain is the same
        # match's first tokens).
        chain, found = ops.ngram_match(ctx.tokens, ctx.lengths, min_n=self.min_ngram, max_n=self.max_ngram,
                                       k=k, earliest=True)
        if self.adaptive:
            costs = ctx.costs
            if costs.packed:  # only rows with a match pay for candidates (one host read, CPU)
                costs = costs.for_rows(int(((found > 0) & ~ctx.finished).sum()))
            k = costs.best_length(self.acceptance, k) or int(explore)
        if k == 0:
            return None
        self.chain = chain[:, :k]
        self.start = ctx.lengths.clone()
        return self.chain

    def observe(self, ctx: Context, accept_len: Tensor, live: Tensor,
                accepted: Tensor | None = None) -> list[list[int]]:
        """Learns from the step just committed; returns, per row of ``live`` (one host read),
        ``[accepted, accepted of this chain alone, the chain's length]``. ``accepted``: this
        step's :meth:`accepted`, when the caller has it already."""
        if self.chain is None:
            return []
        if accepted is None:
            accepted = self.accepted(ctx, accept_len)
        chain_len = (self.chain >= 0).sum(1)
        rows = torch.stack([accept_len, accepted, chain_len], 1)[live].tolist()
        if self.adaptive:
            chains = [(a, n) for _, a, n in rows if n > 0]
            self.acceptance.observe([a for a, _ in chains], [n for _, n in chains])
        return rows

    def accepted(self, ctx: Context, accept_len: Tensor) -> Tensor:
        """``[B]`` how many of this step's chain the committed text took (0 without a chain)."""
        if self.chain is None:
            return torch.zeros_like(accept_len)
        return matched(self.chain[:, None], ctx, self.start, accept_len)[:, 0]


def matched(chains: Tensor, ctx: Context, start: Tensor, accept_len: Tensor) -> Tensor:
    """``[B, M]``: how many leading tokens of each chain ``chains [B, M, k]`` (proposed after
    the root when the rows had ``start`` committed tokens) the step accepted (at most
    ``accept_len``)."""
    k = chains.shape[2]
    columns = torch.arange(k, device=chains.device)
    committed = torch.gather(ctx.tokens, 1, (start[:, None] + columns).clamp_max(ctx.tokens.shape[1] - 1))
    within = columns < accept_len[:, None]
    return ((chains == committed[:, None]) & within[:, None]).long().cumprod(2).sum(2)
