"""The draft model's proposer (`draft_proposer`): its draft caches and passes, and each step's
chain of the draft's tokens, or its tree (grown by ``tree``) or its chain taking copies
(``lookup``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from specdec.model.cache import SpecCache
from specdec.proposers.draft.lookup import propose_with_lookup
from specdec.proposers.draft.tree import Calibration, fed_slots, grow, select
from specdec.proposers.vocab import check_vocabulary, vocab_size
from specdec.loop.protocol import Context, Proposal, Proposer, StepResult
from specdec.loop.cost_model import AcceptanceEstimate
from specdec.loop.verify import draw
from specdec.loop.random_streams import DRAFT, TOKEN
from specdec.loop.shape_choice import accepted_within, choice_for
from specdec.loop.sampling import Sampling
from specdec.model.forward import tree_forward
from specdec.model.prefill import prefill, prefill_from
from specdec.model.prompt_plan import PASS_TOKENS, SharedPrefix

if TYPE_CHECKING:
    from specdec.proposers.draft.method import DraftModel


def draft_proposer(drafts: Sequence[DraftModel], target: torch.nn.Module, prompt: Tensor,
                   prompt_len: Tensor, max_length: int, shared: Sequence[SharedPrefix] = (),
                   donors: tuple[Tensor, Tensor] | None = None) -> _DraftProposer:
    """The proposer of one draft model, or of several drafting from the mean of their
    distributions (`specdec.Ensemble(..., mix="average")`): lengths, adaptivity and coupling
    are the first draft's; each draft's tokenizer is checked against the target's. ``shared``:
    prompt prefixes that groups of rows have in common, computed once (`Context.shared_prefixes`).
    ``donors``: rows joining a batch whose prompts start as some of its rows'
    (`Context.prefix_donors`): their draft prefill waits for `join`, which copies those rows'
    draft entries and computes only the rest."""
    target_vocab = check_vocabulary(drafts[0].model, target, drafts[0].shared_vocab)
    for draft in drafts[1:]:
        check_vocabulary(draft.model, target, draft.shared_vocab)
    return _DraftProposer(drafts, target_vocab, prompt, prompt_len, max_length, shared, donors)


class _DraftProposer(Proposer):
    def __init__(self, drafts: Sequence[DraftModel], target_vocab: int, prompt: Tensor, prompt_len: Tensor,
                 max_length: int, shared: Sequence[SharedPrefix], donors: tuple[Tensor, Tensor] | None) -> None:
        self.method = method = drafts[0]
        B = prompt.shape[0]
        # A tree's frontier nodes wait in the draft caches, uncommitted, until the step is verified.
        self.lookup = method.copied_tokens(B)
        # Per copy position, how often the draft took the copies fed to it (`lookup.py`).
        self.copies_taken = AcceptanceEstimate(prior=0.5)
        # A tree contains its chain: with ``adaptive``, each step drafts whichever of the two has
        # emitted more tokens per ms (measured per step; the chain's tokens on tree steps too).
        self.shape = choice_for(("tree", "chain"), bool(method.adaptive) and method.branches > 1)
        if method.branches > 1 and self.shape is None:
            self.lookup = 0
        # A pass taking copies may write lookup + 1 entries past the chain's.
        room = max_length + max(fed_slots(method.branches, method.depth) if method.branches > 1 else 0,
                                self.lookup + 1)
        self.live = torch.zeros(0)
        self.drafts = [(d.model, SpecCache.for_model(d.model, batch_size=B, max_length=room),
                        d.reduced_head()) for d in drafts]
        self.tree_slots: Tensor | None = None  # the last tree proposal's nodes' draft slots
        self.first: Tensor | None = None       # and which are the draft's first choices (its chain)
        # The draft's probabilities against what the target accepts (adaptive trees' sizing).
        self.calibration = Calibration() if method.adaptive and method.branches > 1 else None
        self.target_vocab = target_vocab
        # Ids every draft may propose: below the shared part of the vocabularies (and heads).
        self.proposable = min(min(vocab_size(d.model), d.shared_vocab or target_vocab,
                                  d.draft_vocab_size or target_vocab) for d in drafts)
        self.proposable = min(self.proposable, target_vocab)
        # Rows with donors: prefilled when they join the batch, from its draft caches.
        self.waiting: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
        if donors is not None:
            self.waiting = (prompt, prompt_len, *donors)
        else:
            for model, cache, head in self.drafts:
                prefill(model, cache, prompt, prompt_len, head, shared=shared, pass_tokens=PASS_TOKENS)

    @property
    def cache(self) -> SpecCache:
        return self.drafts[0][1]  # every draft's cache holds the same tokens

    def score(self, tokens: Tensor, lengths: Tensor | None, sampling: Sampling,
              tree: tuple[Tensor, Tensor, int] | None = None, commit: bool = True) -> Tensor:
        """The drafts' next-token scores over the proposable ids after feeding ``tokens``:
        sampling, the distribution drafted from (the mean of the drafts' warped ones); greedy,
        one draft's logits (a view) or the mean of several drafts' probabilities. ``tree``:
        ``(attention_mask, position_ids, pending)`` of uncommitted tree nodes (`tree_forward`),
        which stay uncommitted; else the tokens are committed, unless ``commit=False``: then a
        chain ``[B, T]`` scored after each token (``[B, T, V]``), left uncommitted."""
        if tree is not None:
            mask, positions, pending = tree
            logits = [tree_forward(model, cache, tokens, attention_mask=mask, position_ids=positions, head=head,
                                   pending=pending)[..., : self.proposable] for model, cache, head in self.drafts]
        elif commit:
            logits = [prefill(model, cache, tokens, lengths, head)[..., : self.proposable]
                      for model, cache, head in self.drafts]
        else:
            logits = [tree_forward(model, cache, tokens, head=head)[..., : self.proposable]
                      for model, cache, head in self.drafts]
        if sampling.do_sample:
            probs = [sampling.probs(x) for x in logits]
            return probs[0] if len(probs) == 1 else torch.stack(probs).mean(0)
        return logits[0] if len(logits) == 1 else torch.stack([x.float().softmax(-1) for x in logits]).mean(0)

    def propose(self, ctx: Context) -> Proposal:
        self._prefill_waiting(None)  # started with donors but never joined to their batch
        method, sampling = self.method, ctx.sampling
        self.first = None
        shape = self.shape.choose(budgeted=ctx.max_nodes is not None) if self.shape else 0
        tree = method.branches > 1 and shape == 0
        self.live = ~ctx.finished
        limit = ctx.node_budget(method.tree_nodes if tree else method.depth)
        if limit == 0:  # the tokens committed meanwhile are fed at the next drafting step
            return Proposal.root_only(ctx.roots())
        start = time.perf_counter()
        # Tokens committed since the draft last saw the context (1, or 2 after a full accept).
        pending = ctx.lengths - self.cache.lengths
        width = int(pending.max())
        columns = torch.arange(width, device=pending.device)
        idx = (self.cache.lengths[:, None] + columns).clamp_max(ctx.tokens.shape[1] - 1)
        scores = self.score(torch.gather(ctx.tokens, 1, idx), pending, sampling)
        if tree:
            return self._propose_tree(ctx, scores, min(method.depth, limit), limit, start)
        if self.lookup:
            return propose_with_lookup(self, ctx, scores, limit, start)
        # Adaptive: per live row, the chance that every draft so far is accepted (the draft's
        # own probabilities of its tokens stand in for it), and the expected emitted tokens.
        reach = (~ctx.finished).float()
        expected = reach.sum()
        drafts, probs = [], []
        for i in range(limit):
            # Coupled: the target's uniform at this position; else the draft's own.
            choice = self.choose(scores, sampling, ctx, ctx.lengths + i, TOKEN if method.coupled else DRAFT)
            if sampling.do_sample and not method.coupled:  # ids past the draft's scores: probability 0
                probs.append(F.pad(scores, (0, self.target_vocab - scores.shape[-1])))
            drafts.append(choice)
            if i + 1 == limit:
                break
            if method.adaptive:
                confidence = self.confidence(scores, choice, sampling)
                reach = reach * confidence
                expected = expected + reach.sum()
                # The next token is taken to be as likely as this one. One host read per token.
                now, gain = torch.stack([expected, (reach * confidence).sum()]).tolist()
                if not ctx.costs.extend_pays(i + 1, now, gain):
                    break
            scores = self.score(choice[:, None], None, sampling)
        if ctx.tokens.device.type == "cpu":
            ctx.costs.observe_draft((time.perf_counter() - start) * 1e3 / len(drafts))
        tokens = torch.cat([ctx.roots(), torch.stack(drafts, 1)], 1)
        parents = torch.arange(-1, len(drafts), device=tokens.device).expand_as(tokens)
        draft_probs = None
        if probs:  # node c was drawn from the draft's distribution at node c - 1
            draft_probs = torch.stack([torch.zeros_like(probs[0])] + probs, 1)
        return Proposal(tokens, parents, draft_probs)

    def choose(self, scores: Tensor, sampling: Sampling, ctx: Context, positions: Tensor,
               stream: int = TOKEN) -> Tensor:
        """The draft's token after each scored position: its argmax, or a draw with the
        uniforms of ``stream`` at ``positions`` (TOKEN: the target's, so the draws are coupled)."""
        if sampling.do_sample:
            return draw(scores, ctx.streams, positions, stream)
        return scores.argmax(-1)

    def confidence(self, scores: Tensor, choice: Tensor, sampling: Sampling) -> Tensor:
        """The draft's probability of each chosen token (it stands in for the chance that the
        target accepts it)."""
        if sampling.do_sample or len(self.drafts) > 1:  # probabilities already
            return torch.gather(scores, -1, choice[..., None])[..., 0]
        top = scores.float()
        return torch.exp(torch.gather(top, -1, choice[..., None])[..., 0] - torch.logsumexp(top, -1))

    def _log_probs(self, scores: Tensor, sampling: Sampling) -> Tensor:
        """Log-probabilities from `score` (logits of one draft greedy, else probabilities)."""
        if sampling.do_sample or len(self.drafts) > 1:
            return scores.log()
        return scores.float().log_softmax(-1)

    def _propose_tree(self, ctx: Context, scores: Tensor, depth: int, limit: int, start: float) -> Proposal:
        sampling = ctx.sampling

        def feed(tokens: Tensor, mask: Tensor, positions: Tensor, pending: int, parent_slot: Tensor) -> Tensor:
            return self._log_probs(self.score(tokens, None, sampling, (mask, positions, pending)), sampling)

        log_scale = self.calibration.log_scale if self.calibration else 0.0
        tree, n, passes = grow(self._log_probs(scores, sampling), feed, self.method.branches, depth, limit, ctx,
                               self.method.adaptive, log_scale=log_scale)
        if ctx.tokens.device.type == "cpu":
            ctx.costs.observe_draft((time.perf_counter() - start) * 1e3 / passes)
        proposal, self.tree_slots, self.first, score = select(tree, n, ctx.roots())
        if self.calibration:
            self.calibration.drafted(proposal, score, log_scale)
        return proposal

    def _prefill_waiting(self, batch: _DraftProposer | None) -> None:
        """Prefills rows that waited for the draft caches of ``batch`` (None: computed whole)."""
        if self.waiting is None:
            return
        prompt, prompt_len, donor, reused = self.waiting
        if batch is None:
            donor, reused = torch.full_like(donor, -1), torch.zeros_like(reused)
        for (model, cache, head), (_, source, _) in zip(self.drafts, (batch or self).drafts):
            prefill_from(model, cache, source, donor, reused, prompt, prompt_len, head)
        self.waiting = None

    def keep_rows(self, rows: Tensor) -> None:
        for _, cache, _ in self.drafts:
            cache.keep_rows(rows)

    def join(self, other: _DraftProposer) -> None:
        """Appends the rows of ``other``'s draft caches, prefilling them first where they wait
        for this batch's (`draft_proposer`'s ``donors``); the adaptive estimates stay this
        batch's."""
        other._prefill_waiting(self)
        for (_, cache, _), (_, theirs, _) in zip(self.drafts, other.drafts):
            cache.join(theirs)

    def update(self, ctx: Context, step: StepResult) -> None:
        if self.shape:
            # A tree step also tells what its chain of the draft's first choices took (the
            # chain's yield; its own steps' length may differ: an estimate).
            chain = None if self.first is None else {1: accepted_within(step.accept_path, self.first)}
            self.shape.emitted(step.accept_len, self.live, chain)
        if self.calibration:
            self.calibration.verified(step.accept_path, self.live)
        if self.tree_slots is not None:
            # Move the accepted nodes' entries into place: those fed to the draft, a prefix of
            # the accepted path (a fed node's parent was fed too).
            slots = torch.gather(self.tree_slots, 1, step.accept_path[:, 1:].clamp_min(0))
            accepted = torch.arange(slots.shape[1], device=slots.device) < step.accept_len[:, None]
            count = (accepted & (slots >= 0)).int().cumprod(1).sum(1)
            for _, cache, _ in self.drafts:
                cache.commit(cache.lengths[:, None] + slots.clamp_min(0), count)
            self.tree_slots = None
        # Keep only the drafts' entries of committed tokens; the new root is fed next step.
        for _, cache, _ in self.drafts:
            cache.rollback(torch.minimum(cache.lengths, ctx.lengths - 1))
