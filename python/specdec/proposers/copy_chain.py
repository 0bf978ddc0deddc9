"""Candidates copied from the context: what followed the EARLIEST earlier occurrence of the
context's longest suffix n-gram (the original being copied), as long as the recent acceptance
and the measured pass costs say pays. Prompt lookup's first chain; lookahead's long copies."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specdec import ops
from specdec.loop.cost_model import AcceptanceEstimate
from specdec.loop.protocol import Context

# Each row's acceptance rate in packed batches: its prior, and the weight of a new step.
ROW_PRIOR = 0.5
ROW_SMOOTHING = 0.5
# A row whose every candidate was taken has rate 1 but may still stop copying: its chain is
# sized as if each candidate had at most this chance.
ROW_RATE_MAX = 0.9


@dataclass
class CopyChain:
    """``propose`` gives this step's chain ``[B, k]`` (-1 padded); ``observe`` after the step
    learns how far it was accepted.

    ``limit``: most candidates; with ``adaptive`` the length maximising expected tokens per ms
    (``CostModel.best_length``), which may be 0 (no chain). In a batch whose passes are packed
    (``CostModel.packed``: each row pays for its own nodes), each row's chain is cut to what
    pays for that row (`row_lengths`): rows copying code keep long chains while rows writing
    new text propose nothing, where one length for every row would fit neither.

    ``rows``: the batch size (each row's acceptance rate starts at ``ROW_PRIOR``)."""

    min_ngram: int
    max_ngram: int
    limit: int
    adaptive: bool
    rows: int = 1
    acceptance: AcceptanceEstimate = field(default_factory=lambda: AcceptanceEstimate(prior=0.5))
    chain: Tensor | None = None          # this step's [B, k]
    start: Tensor = field(default_factory=lambda: torch.zeros(0))  # committed lengths then
    row_rates: Tensor | None = None      # [B] each row's recent per-candidate acceptance

    def __post_init__(self) -> None:
        self.row_rates = torch.full((self.rows,), ROW_PRIOR, dtype=torch.float64)

    def propose(self, ctx: Context, explore: bool = False) -> Tensor | None:
        """The chain, or None when no candidate pays (``explore``: then one candidate anyway,
        so that the estimate can recover) or the context's ``max_nodes`` is 0."""
        self.chain = self.candidates(ctx, explore)
        if self.chain is not None:
            self.start = ctx.lengths.clone()
        return self.chain

    def candidates(self, ctx: Context, explore: bool = False) -> Tensor | None:
        """What :meth:`propose` would propose now, without taking it as this step's chain."""
        k = ctx.node_budget(self.limit)
        if k == 0:
            return None
        # The chain of the longest match, cut to the length that pays (a cut chain is the same
        # match's first tokens).
        chain, found = ops.ngram_match(ctx.tokens, ctx.lengths, min_n=self.min_ngram, max_n=self.max_ngram,
                                       k=k, earliest=True)
        if self.adaptive and ctx.costs.packed and chain.shape[0] > 1:
            lengths = self.row_lengths(ctx, found, k, explore)
            chain = torch.where(torch.arange(k, device=chain.device) < lengths[:, None], chain, -1)
            k = int(lengths.max())  # one host read (packed passes: CPU)
        elif self.adaptive:
            k = ctx.costs.best_length(self.acceptance, k) or int(explore)
        return chain[:, :k] if k > 0 else None

    def row_lengths(self, ctx: Context, found: Tensor, k: int, explore: bool) -> Tensor:
        """``[B]`` each row's candidates: candidate i pays for its row when the chance that it
        and those before it are accepted, ``rate ** i``, exceeds what a candidate node costs in
        a packed pass over what a one-token step costs per emitted token (both from the cost
        model); with ``explore``, rows with a match try one at least, so that a rate that fell
        can recover."""
        costs, rows = ctx.costs.for_rows(1), ctx.tokens.shape[0]
        one_token = costs.target(1)  # the batch's roots alone
        node_ms = max(costs.target(1 + k) - one_token, 0.0) / k
        threshold = node_ms * rows / max(one_token, 1e-9)
        rates = self.row_rates.to(found.device).clamp(1e-9, ROW_RATE_MAX)
        if threshold <= 0:
            paying = torch.full_like(found, k)
        elif threshold >= 1:
            paying = torch.zeros_like(found)
        else:  # i <= log(threshold) / log(rate)
            paying = math.log(threshold) / torch.log(rates)
            paying = paying.floor().clamp(0, k).long()
        if explore:
            paying = paying.clamp_min(1)
        return torch.where((found > 0) & ~ctx.finished, torch.minimum(paying, found), 0)

    def keep_rows(self, rows: Tensor) -> None:
        self.row_rates = self.row_rates[rows.to(self.row_rates.device)]

    def join(self, other: CopyChain) -> None:
        self.row_rates = torch.cat([self.row_rates, other.row_rates])

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
        if self.adaptive and ctx.costs.packed:  # each row's rate sizes only packed passes (CPU)
            # Accepted candidates over those tried (a rejection counts one).
            tried = (accepted + (accepted < chain_len).long()).double()
            sample = accepted.double() / tried.clamp_min(1)
            rates = self.row_rates.to(sample.device)
            self.row_rates = torch.where(chain_len > 0, (1 - ROW_SMOOTHING) * rates + ROW_SMOOTHING * sample, rates)
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
