"""Draft-model speculative decoding: a smaller model proposes a chain of tokens."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.cache import SpecCache
from specdec.decoders.base import Context, Proposal
from specdec.tree_forward import prefill


@dataclass
class DraftModel:
    """Propose ``num_draft_tokens`` tokens per step with a smaller model sharing the target's
    tokenizer. With ``adaptive=True`` the draft decides token by token (up to
    ``max_draft_tokens``): it stops when, from its confidence in the tokens drafted so far and
    the measured draft and target pass costs, one more token is not expected to raise the
    emitted tokens per unit of time (`CostModel.extend_pays`).

    Example (``draft`` and ``target`` are Hugging Face causal LMs)::

        out = specdec.generate(target, input_ids, method=specdec.DraftModel(draft, 5, adaptive=True))
    """

    model: torch.nn.Module
    num_draft_tokens: int = 5
    adaptive: bool = False
    max_draft_tokens: int = 16

    def __post_init__(self) -> None:
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if self.adaptive and self.max_draft_tokens < 1:
            raise ValueError(f"max_draft_tokens must be >= 1, got {self.max_draft_tokens}")

    @property
    def max_candidates(self) -> int:
        return 1 + (max(self.max_draft_tokens, self.num_draft_tokens) if self.adaptive
                    else self.num_draft_tokens)

    @property
    def models(self) -> tuple[torch.nn.Module, ...]:
        return (self.model,)

    def start(self, target, ctx: Context, prompt: Tensor, prompt_len: Tensor, max_length: int):
        return _DraftProposer(self, ctx, prompt, prompt_len, max_length)


class _DraftProposer:
    def __init__(self, method: DraftModel, ctx: Context, prompt: Tensor, prompt_len: Tensor,
                 max_length: int) -> None:
        self.method = method
        self.cache = SpecCache.for_model(method.model, batch_size=prompt.shape[0], max_length=max_length)
        prefill(method.model, self.cache, prompt, prompt_len)

    def propose(self, ctx: Context) -> Proposal:
        method, sampling = self.method, ctx.sampling
        limit = method.max_draft_tokens if method.adaptive else method.num_draft_tokens
        start = time.perf_counter()
        # Tokens committed since the draft last saw the context (1, or 2 after a full accept).
        pending = ctx.lengths - self.cache.lengths
        width = int(pending.max())
        columns = torch.arange(width, device=pending.device)
        idx = (self.cache.lengths[:, None] + columns).clamp_max(ctx.tokens.shape[1] - 1)
        logits = prefill(method.model, self.cache, torch.gather(ctx.tokens, 1, idx), pending)
        # Adaptive: per live row, the chance that every draft so far is accepted (the draft's
        # own probabilities of its tokens stand in for it), and the expected emitted tokens.
        reach = (~ctx.finished).float()
        expected = float(reach.sum())
        drafts, probs = [], []
        for i in range(limit):
            if sampling.do_sample:
                q = sampling.probs(logits)
                probs.append(q)
                token = torch.multinomial(q, 1, generator=ctx.generator)[:, 0]
            else:
                token = logits.argmax(-1)
            drafts.append(token)
            if i + 1 == limit:
                break
            if method.adaptive:
                if sampling.do_sample:
                    confidence = torch.gather(q, 1, token[:, None])[:, 0]
                else:
                    top = logits.float()
                    confidence = torch.exp(top.max(-1).values - torch.logsumexp(top, -1))
                reach = reach * confidence
                expected += float(reach.sum())
                # The next token is taken to be as likely as this one.
                if not ctx.costs.extend_pays(i + 1, expected, float((reach * confidence).sum())):
                    break
            logits = prefill(method.model, self.cache, token[:, None])
        if ctx.tokens.device.type == "cpu":
            ctx.costs.observe_draft((time.perf_counter() - start) * 1e3 / len(drafts))
        root = torch.gather(ctx.tokens, 1, (ctx.lengths - 1)[:, None])
        tokens = torch.cat([root, torch.stack(drafts, 1)], 1)
        parents = torch.arange(-1, len(drafts), device=tokens.device).expand_as(tokens)
        draft_probs = None
        if probs:  # node c was drawn from the draft's distribution at node c - 1
            draft_probs = torch.stack([torch.zeros_like(probs[0])] + probs, 1)
        return Proposal(tokens, parents, draft_probs)

    def update(self, ctx: Context, proposal: Proposal, accept_len: Tensor) -> None:
        # Keep only the draft's entries of committed tokens; the new root is fed next step.
        self.cache.rollback(torch.minimum(self.cache.lengths, ctx.lengths - 1))
