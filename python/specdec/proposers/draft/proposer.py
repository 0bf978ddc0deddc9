"""Draft-model speculative decoding: a smaller model proposes a chain of tokens."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from specdec import ops
from specdec.renamed import take_aliases, warn_renamed
from specdec.model.cache import SpecCache
from specdec.proposers.draft.tree import fed_slots, grow, select
from specdec.proposers.draft.vocab import check_vocabulary, lowest_ids_head, vocab_size
from specdec.loop.protocol import Context, Method, Proposal, Proposer, StepResult
from specdec.loop.verify import draw
from specdec.loop.random_streams import DRAFT, TOKEN
from specdec.loop.shape_choice import accepted_within, choice_for
from specdec.loop.sampling import Sampling
from specdec.model.forward import tree_forward
from specdec.model.prefill import prefill, prefill_from
from specdec.model.prompt_plan import PASS_TOKENS, SharedPrefix


@dataclass
class DraftModel(Method):
    """Propose tokens of a smaller model sharing the target's tokenizer. By default
    (``adaptive``) the draft decides token by token, up to ``max_draft_tokens``: it stops when,
    from its confidence in the tokens drafted so far and the measured draft and target pass
    costs, one more token is not expected to raise the emitted tokens per unit of time
    (`CostModel.extend_pays`). Given ``num_draft_tokens`` (and not ``adaptive=True``), it
    proposes that many tokens every step.

    Names from other libraries are accepted: ``num_assistant_tokens`` (transformers) for
    ``num_draft_tokens``, ``num_speculative_tokens`` (vLLM) for ``max_draft_tokens``;
    ``head_tokens`` is the deprecated name of ``draft_vocab_size``.

    ``draft_vocab_size``: the draft scores only token ids ``0 .. draft_vocab_size - 1``, not the whole
    vocabulary. Byte-level BPE vocabularies (Qwen, Llama 3, GPT-2) number tokens in merge order,
    commonest first, so few good candidates are lost, while each draft token gets cheaper (at
    V = 152k the LM head is a quarter of a 0.5B model's weights). The target's output is
    unaffected: only what is proposed changes. The reduced head is a copy, made on first use.

    Sampling (``do_sample=True``): with ``coupled=True`` (default) the draft draws its token at
    position t with the same uniform the target's draw at t uses, so a candidate is accepted
    when the two draws agree; the output is then token for token what ``method=None`` emits
    with the same seed, whatever the draft lengths. ``coupled=False`` draws the draft's tokens
    on their own and verifies by rejection sampling with the draft's probabilities (lossless,
    accepts somewhat more when draft and target differ; reproducible for a fixed draft length,
    ``adaptive=False``).

    ``tree="dynamic"`` drafts a token tree instead of a chain (EAGLE-2's dynamic trees, as
    ``Medusa(tree="dynamic")``): each level expands the ``top_k`` most probable nodes of the one
    before (by the draft's cumulative probability of their paths) into their ``top_k`` most
    probable children, one draft pass per level over the ``top_k`` nodes, and the target
    verifies the most probable nodes of the whole tree, at most ``tree_nodes``. (``tree=k``, an
    int, is the deprecated spelling of ``tree="dynamic", top_k=k``.) With ``adaptive=True`` the measured pass costs decide how many levels
    (up to ``max_draft_tokens``) and how many nodes pay; else ``num_draft_tokens`` levels and
    ``tree_nodes`` nodes, and each step drafts the tree or the chain ``tree=None`` would (with its
    copies, ``lookup``), whichever has emitted more tokens per ms so far (measured per step, the
    chain's tokens on the tree's steps too: `specdec.loop.shape_choice`). Where the draft's first choice is
    wrong the target often takes its second, and the branch under it goes on. Sampling needs ``coupled=True`` (the branches are
    verified as deterministic candidates: exact, and seeded equal to ``method=None``).

    ``lookup=m`` (chains): each draft pass also feeds up to m tokens copied from the context
    (prompt lookup over the prompt, the output and this step's drafts) after the draft's latest
    token, and takes at once those the draft itself would have chosen next. The chain is the
    same as with ``lookup=0`` (the draft's argmax, or its coupled draws), drafted in fewer draft
    passes where the text repeats earlier text (code editing); the pass costs a little more
    than a one-token pass. Prompt lookup drafting for the draft (a cascade). Default (None): 8
    for the chains of a batch of one row with coupled draws (an adaptive tree's chain steps
    too), else 0 (a batch's draft pass would be as wide as its rows' copies together, and
    ``coupled=False`` needs its own draws).

    The draft must share the target's tokenizer. When the two vocabularies differ only by
    padding rows past the tokenizer (e.g. Qwen2.5 7B and 0.5B), pass ``shared_vocab=len(tokenizer)``:
    the draft then never proposes an id at or past it.

    Example (``draft`` and ``target`` are Hugging Face causal LMs)::

        out = specdec.generate(target, input_ids, method=specdec.DraftModel(draft))
        out = specdec.generate(target, input_ids, method=specdec.DraftModel(draft, tree="dynamic", top_k=3))
        out = specdec.generate(target, input_ids, method=specdec.DraftModel(draft, lookup=8))
        out = specdec.generate(target, input_ids, method=specdec.DraftModel(draft, num_draft_tokens=5))  # fixed
    """

    model: torch.nn.Module
    num_draft_tokens: int | None = None  # fixed length (default 5 where not adaptive)
    adaptive: bool | None = None          # default: True unless num_draft_tokens is given
    max_draft_tokens: int = 16
    draft_vocab_size: int | None = None
    coupled: bool = True
    shared_vocab: int | None = None
    tree: str | None = None  # None: a chain; "dynamic": a tree of the draft's top_k per node
    top_k: int = 4
    tree_nodes: int = 24
    lookup: int | None = None
    _head: tuple | None = field(default=None, init=False, repr=False, compare=False)
    num_assistant_tokens: InitVar[int | None] = None
    num_speculative_tokens: InitVar[int | None] = None
    head_tokens: InitVar[int | None] = None

    def __post_init__(self, num_assistant_tokens: int | None, num_speculative_tokens: int | None,
                      head_tokens: int | None) -> None:
        take_aliases(self, {"num_assistant_tokens": num_assistant_tokens,
                            "num_speculative_tokens": num_speculative_tokens, "head_tokens": head_tokens},
                     {"num_assistant_tokens": "num_draft_tokens", "num_speculative_tokens": "max_draft_tokens",
                      "head_tokens": "draft_vocab_size"}, deprecated={"head_tokens"})
        if self.adaptive is None:
            self.adaptive = self.num_draft_tokens is None
        if self.num_draft_tokens is None:
            self.num_draft_tokens = 5
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if self.adaptive and self.max_draft_tokens < 1:
            raise ValueError(f"max_draft_tokens must be >= 1, got {self.max_draft_tokens}")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"draft_vocab_size must be >= 1 or None, got {self.draft_vocab_size}")
        if self.shared_vocab is not None and self.shared_vocab < 1:
            raise ValueError(f"shared_vocab must be >= 1 or None, got {self.shared_vocab}")
        if isinstance(self.tree, int) and not isinstance(self.tree, bool):
            warn_renamed(f"DraftModel(tree={self.tree})", 'tree="dynamic", top_k=k (or tree=None for a chain)',
                         stacklevel=4)
            if self.tree < 1:
                raise ValueError(f"tree must be >= 1 (1: a chain), got {self.tree}")
            self.tree, self.top_k = ("dynamic", self.tree) if self.tree > 1 else (None, self.top_k)
        if self.tree not in (None, "dynamic"):
            raise ValueError(f'DraftModel: tree must be None (a chain) or "dynamic", got {self.tree!r}')
        if self.tree and self.top_k < 2:
            raise ValueError(f"DraftModel: a tree needs top_k >= 2 (1 is a chain), got {self.top_k}")
        if self.branches > 1 and self.tree_nodes < 1:
            raise ValueError(f"tree_nodes must be >= 1, got {self.tree_nodes}")
        if self.lookup is not None and self.lookup < 0:
            raise ValueError(f"lookup must be >= 0 (0: off) or None, got {self.lookup}")
        if self.lookup and self.branches > 1:
            raise ValueError("DraftModel(lookup=...) drafts chains: it needs tree=None")
        if self.lookup and not self.coupled:
            raise ValueError("DraftModel(lookup=...) takes copied tokens where the draft would have chosen "
                             "them: it needs coupled=True")
        if self.branches > 1 and not self.coupled:
            raise ValueError("DraftModel(tree=...) verifies its branches as deterministic candidates: "
                             "it needs coupled=True")

    @property
    def branches(self) -> int:
        """Children per expanded node: ``top_k`` for a tree, 1 for a chain."""
        return self.top_k if self.tree == "dynamic" else 1

    @property
    def depth(self) -> int:
        """Most draft tokens on a path (levels of a tree)."""
        return self.max_draft_tokens if self.adaptive else self.num_draft_tokens

    @property
    def max_pass_tokens(self) -> int:
        return 1 + (self.tree_nodes if self.branches > 1 else self.depth)

    def copied_tokens(self, rows: int) -> int:
        """Copied tokens per draft pass of a chain, for a batch of ``rows`` (``lookup``, or its
        default; also the chain an adaptive tree falls back to)."""
        if self.lookup is not None:
            return self.lookup
        return 8 if rows == 1 and self.coupled else 0

    @property
    def models(self) -> tuple[torch.nn.Module, ...]:
        return (self.model,)

    def start(self, target, ctx: Context, prompt: Tensor, prompt_len: Tensor, max_length: int,
              first: StepResult):
        return draft_proposer([self], target, prompt, prompt_len, max_length, ctx.shared_prefixes, ctx.prefix_donors)

    def reduced_head(self) -> torch.nn.Module | None:
        """The draft's LM head over ids ``0 .. draft_vocab_size - 1`` (None without ``draft_vocab_size``),
        made once per head module and device."""
        if self.draft_vocab_size is None:
            return None
        lm_head = self.model.get_output_embeddings()
        key = (id(lm_head), str(self.model.device))
        if self._head is None or self._head[0] != key:
            self._head = (key, lowest_ids_head(lm_head, self.draft_vocab_size))
        return self._head[1]


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

    def _scores(self, tokens: Tensor, lengths: Tensor | None, sampling: Sampling,
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
        scores = self._scores(torch.gather(ctx.tokens, 1, idx), pending, sampling)
        if tree:
            return self._propose_tree(ctx, scores, min(method.depth, limit), limit, start)
        if self.lookup:
            return self._propose_copying(ctx, scores, limit, start)
        # Adaptive: per live row, the chance that every draft so far is accepted (the draft's
        # own probabilities of its tokens stand in for it), and the expected emitted tokens.
        reach = (~ctx.finished).float()
        expected = reach.sum()
        drafts, probs = [], []
        for i in range(limit):
            # Coupled: the target's uniform at this position; else the draft's own.
            choice = self._choose(scores, sampling, ctx, ctx.lengths + i, TOKEN if method.coupled else DRAFT)
            if sampling.do_sample and not method.coupled:  # ids past the draft's scores: probability 0
                probs.append(F.pad(scores, (0, self.target_vocab - scores.shape[-1])))
            drafts.append(choice)
            if i + 1 == limit:
                break
            if method.adaptive:
                confidence = self._confidence(scores, choice, sampling)
                reach = reach * confidence
                expected = expected + reach.sum()
                # The next token is taken to be as likely as this one. One host read per token.
                now, gain = torch.stack([expected, (reach * confidence).sum()]).tolist()
                if not ctx.costs.extend_pays(i + 1, now, gain):
                    break
            scores = self._scores(choice[:, None], None, sampling)
        if ctx.tokens.device.type == "cpu":
            ctx.costs.observe_draft((time.perf_counter() - start) * 1e3 / len(drafts))
        tokens = torch.cat([ctx.roots(), torch.stack(drafts, 1)], 1)
        parents = torch.arange(-1, len(drafts), device=tokens.device).expand_as(tokens)
        draft_probs = None
        if probs:  # node c was drawn from the draft's distribution at node c - 1
            draft_probs = torch.stack([torch.zeros_like(probs[0])] + probs, 1)
        return Proposal(tokens, parents, draft_probs)

    def _propose_copying(self, ctx: Context, scores: Tensor, limit: int, start: float) -> Proposal:
        """The chain of `propose`, each draft pass feeding the row's latest draft and the tokens
        that copying the context proposes after it (`DraftModel.lookup`): a row takes the
        draft's choices up to where they leave the copy. One host read per draft pass."""
        method, sampling = self.method, ctx.sampling
        B, device = scores.shape[0], scores.device
        span = limit + self.lookup + 1  # a pass may score up to lookup + 1 tokens past the limit
        columns = torch.arange(span, device=device)
        drafted = torch.full((B, span), -1, dtype=torch.int64, device=device)
        # Per drafted token: the chance that it and every draft before it are accepted.
        reaches = torch.zeros(B, span, device=device)
        text = F.pad(ctx.tokens, (0, span))  # the committed tokens, then this step's drafts
        count = torch.zeros(B, dtype=torch.int64, device=device)
        reach = (~ctx.finished).float()
        live, passes, feed = float(reach.sum()), 1, None  # feed: the tokens of the latest pass
        scores = scores[:, None]
        while True:
            width = scores.shape[1]
            slots = count[:, None] + columns[:width]
            choice = self._choose(scores, sampling, ctx, ctx.lengths[:, None] + slots)
            taken = torch.ones_like(count)  # the choice after the latest draft, and copies it agrees with
            if feed is not None and width > 1:
                taken += (feed[:, 1:] == choice[:, :-1]).long().cumprod(1).sum(1)
            taken = torch.minimum(taken, limit - count)
            if feed is not None:  # keep the entries of the fed tokens whose next choice was taken
                for _, cache, _ in self.drafts:
                    cache.advance(taken)
            kept = columns[:width] < taken[:, None]
            confidence = torch.where(kept, self._confidence(scores, choice, sampling), 1.0)
            path = reach[:, None] * confidence.cumprod(1)
            drafted.scatter_(1, slots, torch.where(kept, choice, -1))
            reaches.scatter_(1, slots, torch.where(kept, path, 0.0))
            text.scatter_(1, ctx.lengths[:, None] + slots, choice)
            last = (taken - 1).clamp_min(0)[:, None]
            reach = torch.where(taken > 0, torch.gather(path, 1, last)[:, 0], reach)
            count += taken
            # Next: each row's latest draft, then the copies the limit leaves room for taking.
            copies, n = ops.ngram_match(text, ctx.lengths + count, min_n=1, max_n=3, k=self.lookup, earliest=True)
            n = torch.minimum(n, (limit - 1 - count).clamp_min(0))
            feed = torch.cat([torch.gather(drafted, 1, (count - 1)[:, None]),
                              torch.where(columns[: self.lookup] < n[:, None], copies, -1)], 1)
            # The next token is taken to be as likely as the latest one (rows at the limit stop).
            gain = (reach * torch.gather(confidence, 1, last)[:, 0] * (count < limit)).sum()
            expected = live + reaches.sum()
            now, gain, drafted_max, drafted_min, copied = torch.stack([
                expected, gain, count.max().float(), count.min().float(),
                (feed[:, 1:] >= 0).sum(1).max().float()]).tolist()
            if drafted_min >= limit or (method.adaptive and not ctx.costs.extend_pays(
                    int(drafted_max), now, gain, passes)):
                break
            passes += 1
            feed = feed[:, : 1 + int(copied)]
            scores = self._scores(feed.clamp_min(0), None, sampling, commit=False)
        if ctx.tokens.device.type == "cpu":
            ctx.costs.observe_draft((time.perf_counter() - start) * 1e3 / passes)
        best = int(drafted_max)
        if method.adaptive:  # copied tokens may have made the chain longer than its target pass pays for
            gains = reaches[:, :best].sum(0).cumsum(0).tolist()
            best = max(range(1, best + 1), key=lambda w: (live + gains[w - 1]) / ctx.costs.step_ms(w, passes))
        tokens = torch.cat([ctx.roots(), drafted[:, :best]], 1)
        parents = torch.arange(-1, best, device=device).expand_as(tokens)
        return Proposal(tokens, parents)

    def _choose(self, scores: Tensor, sampling: Sampling, ctx: Context, positions: Tensor,
                stream: int = TOKEN) -> Tensor:
        """The draft's token after each scored position: its argmax, or a draw with the
        uniforms of ``stream`` at ``positions`` (TOKEN: the target's, so the draws are coupled)."""
        if sampling.do_sample:
            return draw(scores, ctx.streams, positions, stream)
        return scores.argmax(-1)

    def _confidence(self, scores: Tensor, choice: Tensor, sampling: Sampling) -> Tensor:
        """The draft's probability of each chosen token (it stands in for the chance that the
        target accepts it)."""
        if sampling.do_sample or len(self.drafts) > 1:  # probabilities already
            return torch.gather(scores, -1, choice[..., None])[..., 0]
        top = scores.float()
        return torch.exp(torch.gather(top, -1, choice[..., None])[..., 0] - torch.logsumexp(top, -1))

    def _log_probs(self, scores: Tensor, sampling: Sampling) -> Tensor:
        """Log-probabilities from `_scores` (logits of one draft greedy, else probabilities)."""
        if sampling.do_sample or len(self.drafts) > 1:
            return scores.log()
        return scores.float().log_softmax(-1)

    def _propose_tree(self, ctx: Context, scores: Tensor, depth: int, limit: int, start: float) -> Proposal:
        sampling = ctx.sampling

        def feed(tokens: Tensor, mask: Tensor, positions: Tensor, pending: int, parent_slot: Tensor) -> Tensor:
            return self._log_probs(self._scores(tokens, None, sampling, (mask, positions, pending)), sampling)

        tree, n, passes = grow(self._log_probs(scores, sampling), feed, self.method.branches, depth, limit, ctx,
                               self.method.adaptive)
        if ctx.tokens.device.type == "cpu":
            ctx.costs.observe_draft((time.perf_counter() - start) * 1e3 / passes)
        proposal, self.tree_slots, self.first = select(tree, n, ctx.roots())
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
