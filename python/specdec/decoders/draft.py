"""Draft-model speculative decoding: a smaller model proposes a chain of tokens."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.cache import SpecCache
from specdec.cost_model import AcceptanceEstimate
from specdec.decoders.base import Context, Proposal
from specdec.tree_forward import prefill


@dataclass
class DraftModel:
    """Propose ``num_draft_tokens`` tokens per step with a smaller model sharing the target's
    tokenizer. With ``adaptive=True`` the number per step (up to ``max_draft_tokens``) is chosen
    from the recent acceptance and the measured draft and target pass costs.

    Example (``draft`` and ``target`` are Hugging Face causal LMs)::

        out = specdec.generate(target, input_ids, method=specdec.DraftModel(draft, 5, adaptive=True))
    """

    model: torch.nn.Module
    num_draft_tokens: int = 5
    adaptive: bool = False
    max_draft_tokens: int = 12

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
        self.acceptance = AcceptanceEstimate()
        self.length = method.num_draft_tokens
        prefill(method.model, self.cache, prompt, prompt_len)

    def propose(self, ctx: Context) -> Proposal:
        model, sampling = self.method.model, ctx.sampling
        if self.method.adaptive:
            self.length = max(1, ctx.costs.best_length(self.acceptance, self.method.max_draft_tokens))
        start = time.perf_counter()
        # Tokens committed since the draft last saw the context (1, or 2 after a full accept).
        pending = ctx.lengths - self.cache.lengths
        width = int(pending.max())
        columns = torch.arange(width, device=pending.device)
        idx = (self.cache.lengths[:, None] + columns).clamp_max(ctx.tokens.shape[1] - 1)
        logits = prefill(model, self.cache, torch.gather(ctx.tokens, 1, idx), pending)
        drafts, probs = [], []
        for i in range(self.length):
            if sampling.do_sample:
                q = sampling.probs(logits)
                probs.append(q)
                token = torch.multinomial(q, 1, generator=ctx.generator)[:, 0]
            else:
                token = logits.argmax(-1)
            drafts.append(token)
            if i + 1 < self.length:
                logits = prefill(model, self.cache, token[:, None])
        if ctx.tokens.device.type == "cpu":
            ctx.costs.observe_draft((time.perf_counter() - start) * 1e3 / self.length)
        root = torch.gather(ctx.tokens, 1, (ctx.lengths - 1)[:, None])
        tokens = torch.cat([root, torch.stack(drafts, 1)], 1)
        parents = torch.arange(-1, self.length, device=tokens.device).expand_as(tokens)
        draft_probs = None
        if probs:  # node c was drawn from the draft's distribution at node c - 1
            draft_probs = torch.stack([torch.zeros_like(probs[0])] + probs, 1)
        return Proposal(tokens, parents, draft_probs)

    def update(self, ctx: Context, proposal: Proposal, accept_len: Tensor) -> None:
        # Keep only the draft's entries of committed tokens; the new root is fed next step.
        self.cache.rollback(torch.minimum(self.cache.lengths, ctx.lengths - 1))
        if self.method.adaptive:  # the estimate costs a host sync: only when it is used
            accepted = accept_len[~ctx.finished].tolist()
            self.acceptance.observe(accepted, [self.length] * len(accepted))
