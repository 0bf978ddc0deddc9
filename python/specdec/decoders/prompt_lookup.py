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
        rows_tokens, rows_parents, proposed = [], [], []
        for b in range(root.shape[0]):
            tokens, parents = [int(root[b, 0])], [-1]
            children: dict[tuple[int, int], int] = {}
            chains = [draft[b, : int(draft_len[b])].tolist()]
            chains.append(_earliest_continuation(ctx.tokens[b], int(ctx.lengths[b]), m.min_ngram,
                                                 m.max_ngram, k))
            for chain in chains:
                node = 0
                for token in chain:
                    if (node, token) not in children:
                        children[(node, token)] = len(tokens)
                        tokens.append(token)
                        parents.append(node)
                    node = children[(node, token)]
            rows_tokens.append(tokens)
            rows_parents.append(parents)
            proposed.append(max(len(c) for c in chains))
        width = max(len(t) for t in rows_tokens)
        for tokens, parents in zip(rows_tokens, rows_parents):  # padding nodes under the root
            parents += [0] * (width - len(tokens))
            tokens += [-1] * (width - len(tokens))
        device = root.device
        self.proposed = torch.tensor(proposed, device=device)
        return Proposal(torch.tensor(rows_tokens, device=device), torch.tensor(rows_parents, device=device))

    def update(self, ctx: Context, proposal: Proposal, accept_len: Tensor) -> None:
        has = (self.proposed > 0) & ~ctx.finished
        self.acceptance.observe(accept_len[has].tolist(), self.proposed[has].tolist())


def _earliest_continuation(row: Tensor, length: int, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k tokens after the EARLIEST occurrence of the longest suffix n-gram of
    ``row[:length]`` (n from max_n down to min_n) that starts before the suffix itself."""
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        starts = row[: length - 1].unfold(0, n, 1)  # windows starting before length - n
        hits = torch.nonzero((starts == row[length - n: length]).all(1)).flatten()
        if hits.numel():
            start = int(hits[0]) + n
            return row[start: min(start + k, length)].tolist()
    return []
