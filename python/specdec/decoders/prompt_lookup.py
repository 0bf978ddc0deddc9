"""Prompt lookup decoding: candidates copied from earlier in the prompt and output."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from specdec import ops
from specdec.cost_model import AcceptanceEstimate
from specdec.decoders.protocol import Context, Proposal, StepResult


@dataclass
class PromptLookup:
    """Propose what followed earlier occurrences of the context's longest suffix n-gram
    (``max_ngram`` down to ``min_ngram`` tokens), as one tree verified in one pass:

    - the continuation of the EARLIEST occurrence (the original being copied; HF's choice):
      ``num_draft_tokens`` tokens, or with ``adaptive=True`` (default) as many as the recent
      acceptance and the measured pass costs say pay, up to ``max_draft_tokens``;
    - the first ``side_tokens`` of the MOST RECENT occurrence's continuation (a repeated line);
    - the first ``side_tokens`` of a substitution match: the suffix without its last token
      matched, and what followed the token after it (the copy goes on after one changed token,
      such as a renamed identifier).

    Branches share their common prefixes; ``side_tokens=0`` verifies the first chain alone.

    Example (``model`` a Hugging Face causal LM)::

        out = specdec.generate(model, input_ids, method=specdec.PromptLookup(max_ngram=3))
    """

    max_ngram: int = 3
    min_ngram: int = 1
    num_draft_tokens: int = 10
    adaptive: bool = True
    max_draft_tokens: int = 32
    side_tokens: int = 4

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if self.adaptive and self.max_draft_tokens < 1:
            raise ValueError(f"max_draft_tokens must be >= 1, got {self.max_draft_tokens}")
        if self.side_tokens < 0:
            raise ValueError(f"side_tokens must be >= 0, got {self.side_tokens}")

    @property
    def chain_limit(self) -> int:
        """Most candidates of the first chain."""
        return self.max_draft_tokens if self.adaptive else self.num_draft_tokens

    @property
    def max_pass_tokens(self) -> int:
        return 1 + self.chain_limit + 2 * self.side_tokens

    @property
    def models(self) -> tuple[torch.nn.Module, ...]:
        return ()

    @property
    def needs_hidden_states(self) -> bool:
        return False

    def start(self, target, ctx: Context, prompt: Tensor, prompt_len: Tensor, max_length: int,
              first: StepResult):
        return _LookupProposer(self)


class _LookupProposer:
    def __init__(self, method: PromptLookup) -> None:
        self.method = method
        self.acceptance = AcceptanceEstimate(prior=0.5)  # of the first chain, per position
        self.side_gain = 0.5  # running mean of the tokens per step the side branches added
        self.steps = 0
        self.main: Tensor | None = None  # this step's first chain [B, k]
        self.start = torch.zeros(0)      # committed lengths when it was proposed
        self.sides = False

    def propose(self, ctx: Context) -> Proposal:
        m = self.method
        k = m.chain_limit
        self.steps += 1
        if m.adaptive:
            # When no candidate pays, still try one now and then so the estimate can recover.
            k = ctx.costs.best_length(self.acceptance, k) or int(self.steps % 8 == 0)
        root = ctx.roots()
        self.main = None
        if k == 0:
            return Proposal(root, torch.full_like(root, -1))
        match = functools.partial(ops.ngram_match, min_n=m.min_ngram, max_n=m.max_ngram)
        self.main, self.start = match(ctx.tokens, ctx.lengths, k=k, earliest=True)[0], ctx.lengths.clone()
        chains = [self.main]
        side = min(m.side_tokens, k)
        self.sides = side > 0 and self._sides_pay(ctx, k, side)
        if self.sides:
            chains.append(match(ctx.tokens, ctx.lengths, k=side)[0])
            # Matched without the last token: skip the token that followed the occurrence.
            chains.append(match(ctx.tokens, (ctx.lengths - 1).clamp_min(0), k=side + 1)[0][:, 1:])
        chains = torch.stack([F.pad(c, (0, k - c.shape[1]), value=-1) for c in chains], 1)
        tokens, parents = _merge_chains(root, chains)
        return Proposal(tokens, parents)

    def _sides_pay(self, ctx: Context, k: int, side: int) -> bool:
        """Whether the side branches' expected extra tokens are worth their share of the pass
        (always when not adaptive; every 8th step regardless, so the estimate stays current)."""
        if not self.method.adaptive or self.steps % 8 == 0:
            return True
        expected = self.acceptance.expected(k)
        with_sides = (expected + self.side_gain) / ctx.costs.target(1 + k + 2 * side)
        return with_sides > expected / ctx.costs.target(1 + k)

    def update(self, ctx: Context, step: StepResult) -> None:
        accept_len = step.accept_len
        # The estimates cost a host sync: only when they are used.
        if not self.method.adaptive or self.main is None:
            return
        k = self.main.shape[1]
        columns = torch.arange(k, device=self.main.device)
        committed = torch.gather(ctx.tokens, 1, (self.start[:, None] + columns).clamp_max(ctx.tokens.shape[1] - 1))
        # How far the first chain alone would have been accepted, and what the sides added.
        main_accepted = ((self.main == committed) & (columns < accept_len[:, None])).long().cumprod(1).sum(1)
        main_len = (self.main >= 0).sum(1)
        live = ~ctx.finished
        # One host read: per live row, (accepted, of the first chain's, its length).
        rows = torch.stack([accept_len, main_accepted, main_len], 1)[live].tolist()
        chain = [(a, n) for _, a, n in rows if n > 0]
        self.acceptance.observe([a for a, _ in chain], [n for _, n in chain])
        if self.sides and rows:
            gain = sum(total - a for total, a, _ in rows) / len(rows)
            self.side_gain = 0.8 * self.side_gain + 0.2 * gain


def _merge_chains(root: Tensor, chains: Tensor) -> tuple[Tensor, Tensor]:
    """Tokens and parents [B, T] of the tree with root ``root [B, 1]`` and the chains
    ``chains [B, M, k]`` (-1 padded) below it, merged where they share a prefix: a node belongs
    to the first chain with its prefix. Nodes are [root, chain 0's, chain 1's own, ...], padding
    (-1, under the root) at the end of a row; T is the largest node count of a row (one host
    sync, to size the pass)."""
    B, M, k = chains.shape
    valid = chains >= 0
    # same[b, m, n, i]: chains m and n agree on their first i + 1 tokens.
    same = ((chains[:, :, None] == chains[:, None]) & valid[:, :, None]).long().cumprod(3)
    owner = same.argmax(2)  # the first such chain (argmax returns the first maximum)
    own = valid & (owner == torch.arange(M, device=chains.device)[:, None])
    columns = torch.arange(k, device=chains.device)
    # Node (m, i) sits at 1 + m * k + i; its parent is node (owner of (m, i - 1), i - 1), or the root.
    parent = torch.cat([torch.zeros_like(owner[..., :1]), 1 + owner[..., :-1] * k + columns[:-1]], 2)
    tokens = torch.cat([root, torch.where(own, chains, -1).reshape(B, M * k)], 1)
    parents = torch.cat([torch.full_like(root, -1), parent.reshape(B, M * k)], 1)
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
