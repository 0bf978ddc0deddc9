"""Prompt lookup decoding: candidates copied from earlier in the prompt and output."""

from __future__ import annotations

import functools
from dataclasses import InitVar, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from specdec import ops
from specdec.renamed import take_aliases
from specdec.loop.cost_model import EXPLORE_EVERY
from specdec.proposers.copy_chain import CopyChain, matched
from specdec.loop.protocol import Context, Method, Proposal, Proposer, StepResult
from specdec.proposers.merge import merge_chains


@dataclass
class PromptLookup(Method):
    """Propose what followed earlier occurrences of the context's longest suffix n-gram
    (``max_ngram`` down to ``min_ngram`` tokens), as one tree verified in one pass:

    - the continuation of the EARLIEST occurrence (the original being copied; HF's choice): by
      default (``adaptive``) as many tokens as the recent acceptance and the measured pass costs
      say pay, up to ``max_draft_tokens``; given ``num_draft_tokens`` (and not
      ``adaptive=True``), that many;
    - the first ``side_tokens`` of the MOST RECENT occurrence's continuation (a repeated line);
    - the first ``side_tokens`` of a substitution match: the suffix without its last token
      matched, and what followed the token after it (the copy goes on after one changed token,
      such as a renamed identifier).

    Branches share their common prefixes; ``side_tokens=0`` verifies the first chain alone.
    ``prompt_lookup_num_tokens`` (transformers) is accepted for ``num_draft_tokens``,
    ``num_speculative_tokens`` (vLLM) for ``max_draft_tokens``.

    Example (``model`` a Hugging Face causal LM)::

        out = specdec.generate(model, input_ids, method=specdec.PromptLookup(max_ngram=3))
    """

    max_ngram: int = 3
    min_ngram: int = 1
    num_draft_tokens: int | None = None  # fixed length (default 10 where not adaptive)
    adaptive: bool | None = None          # default: True unless num_draft_tokens is given
    max_draft_tokens: int = 32
    side_tokens: int = 4
    prompt_lookup_num_tokens: InitVar[int | None] = None
    num_speculative_tokens: InitVar[int | None] = None

    def __post_init__(self, prompt_lookup_num_tokens: int | None, num_speculative_tokens: int | None) -> None:
        take_aliases(self, {"prompt_lookup_num_tokens": prompt_lookup_num_tokens,
                            "num_speculative_tokens": num_speculative_tokens},
                     {"prompt_lookup_num_tokens": "num_draft_tokens", "num_speculative_tokens": "max_draft_tokens"})
        if self.adaptive is None:
            self.adaptive = self.num_draft_tokens is None
        if self.num_draft_tokens is None:
            self.num_draft_tokens = 10
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

    def start(self, target, ctx: Context, prompt: Tensor, prompt_len: Tensor, max_length: int,
              first: StepResult):
        return LookupProposer(self, ctx.tokens.shape[0])


class LookupProposer(Proposer):
    def __init__(self, method: PromptLookup, rows: int) -> None:
        self.method = method
        self.main = CopyChain(method.min_ngram, method.max_ngram, method.chain_limit, method.adaptive, rows)
        self.side_gain = 0.5  # running mean of the tokens per step the side branches added
        self.steps = 0
        self.sides = False
        self.proposed: Tensor | None = None  # this step's chains [B, M, k]
        self.nodes = 0                       # and at most how many nodes they make

    def propose(self, ctx: Context) -> Proposal:
        root = ctx.roots()
        chains = self.chains(ctx)
        if chains is None:
            return Proposal.root_only(root)
        tokens, parents = merge_chains(root, chains)
        return Proposal(tokens, parents)

    def chains(self, ctx: Context) -> Tensor | None:
        """This step's chains ``[B, M, k]`` (-1 padded): the first chain, then the side branches
        where they pay; None where no candidate pays."""
        m = self.method
        self.steps += ctx.max_nodes != 0  # steps told to propose nothing do not count
        main = self.main.propose(ctx, explore=self.steps % EXPLORE_EVERY == 0)
        self.proposed, self.nodes = None, 0
        if main is None:
            return None
        k = main.shape[1]
        chains = [main]
        side = min(m.side_tokens, k, (ctx.node_budget(k + 2 * m.side_tokens) - k) // 2)
        self.sides = side > 0 and self._sides_pay(ctx, k, side)
        if self.sides:
            match = functools.partial(ops.ngram_match, min_n=m.min_ngram, max_n=m.max_ngram)
            chains.append(match(ctx.tokens, ctx.lengths, k=side)[0])
            # Matched without the last token: skip the token that followed the occurrence.
            chains.append(match(ctx.tokens, (ctx.lengths - 1).clamp_min(0), k=side + 1)[0][:, 1:])
        self.nodes = k + 2 * side * self.sides
        self.proposed = torch.stack([F.pad(c, (0, k - c.shape[1]), value=-1) for c in chains], 1)
        return self.proposed

    def shadow(self, ctx: Context) -> Tensor:
        """Its first chain (no side branches); an empty one where it would propose nothing."""
        chain = self.main.candidates(ctx)
        return chain if chain is not None else ctx.tokens.new_empty((ctx.tokens.shape[0], 0))

    def expected(self) -> float:
        """Tokens per row this step's chains are expected to add (1: no chains)."""
        if self.proposed is None:
            return 1.0
        return self.main.acceptance.expected(self.proposed.shape[2]) + self.sides * self.side_gain

    def accepted(self, ctx: Context, accept_len: Tensor) -> Tensor:
        """``[B]`` how many of this step's candidates the committed text took (the best chain)."""
        if self.proposed is None:
            return torch.zeros_like(accept_len)
        return matched(self.proposed, ctx, self.main.start, accept_len).max(1).values

    def _sides_pay(self, ctx: Context, k: int, side: int) -> bool:
        """Whether the side branches' expected extra tokens are worth their share of the pass
        (always when not adaptive; every 8th step regardless, so the estimate stays current)."""
        if not self.method.adaptive or self.steps % EXPLORE_EVERY == 0:
            return True
        expected = self.main.acceptance.expected(k)
        with_sides = (expected + self.side_gain) / ctx.costs.target(1 + k + 2 * side)
        return with_sides > expected / ctx.costs.target(1 + k)

    def keep_rows(self, rows: Tensor) -> None:
        self.main.keep_rows(rows)

    def join(self, other: LookupProposer) -> None:
        """Appends ``other``'s rows' acceptance rates; the batch's estimates stay this one's."""
        self.main.join(other.main)

    def update(self, ctx: Context, step: StepResult) -> None:
        self.observe(ctx, step.accept_len)  # its tree was the step's whole tree

    def observe(self, ctx: Context, accepted: Tensor) -> None:
        """Learns from the step just committed, where ``accepted [B]`` of this step's candidates
        were taken (`accepted`, when they were part of a larger tree such as lookahead's)."""
        # The estimates cost a host sync: only when they are used.
        if not self.method.adaptive:
            return
        rows = self.main.observe(ctx, accepted, ~ctx.finished)
        if self.sides and rows:  # what the sides added beyond the first chain
            gain = sum(total - a for total, a, _ in rows) / len(rows)
            self.side_gain = 0.8 * self.side_gain + 0.2 * gain
