"""EAGLE: a one-layer drafter on the target's own final hidden states drafts a token tree,
verified in one target pass (EAGLE-2's dynamic trees)."""

from __future__ import annotations

import time
from dataclasses import InitVar, dataclass

import torch
from torch import Tensor

from specdec.loop.protocol import Context, Method, Proposal, Proposer, StepResult
from specdec.loop.shape_choice import accepted_within, choice_for
from specdec.model.cache import SpecCache
from specdec.model.forward import forward_pass
from specdec.model.prefill import prefill_pass
from specdec.model.prepare import is_prepared
from specdec.proposers.draft.tree import Calibration, fed_slots, grow, select
from specdec.proposers.eagle.drafter import EagleDrafter
from specdec.renamed import take_aliases


@dataclass
class Eagle(Method):
    """Propose a token tree drafted by an EAGLE drafter (`specdec.EagleDrafter`, trained by
    `specdec.train_eagle`): it reads the target's final hidden state at each committed token and
    predicts the next one's, feeding its own predictions back in deeper in the tree.

    ``tree="dynamic"`` (default, EAGLE-2): each level expands the ``top_k`` nodes whose paths
    the drafter finds most probable into their ``top_k`` most probable children, one drafter
    pass per level, and the target verifies the most probable nodes of the whole tree, at most
    ``tree_nodes``. ``tree=None``: a chain (the drafter's first choice at each level). With
    ``adaptive=True`` (default) the measured drafter and target pass costs decide how many
    levels (up to ``max_draft_tokens``) and how many nodes pay (the drafter's probabilities
    calibrated against what the target accepts: `specdec.proposers.draft.tree.Calibration`), and
    each step drafts the tree or the chain, whichever has emitted the most tokens per ms so far
    (measured per step, the chain's tokens on tree steps too: `specdec.loop.shape_choice`);
    else ``max_draft_tokens`` levels and ``tree_nodes`` nodes. ``num_speculative_tokens`` (vLLM's name) is accepted for
    ``max_draft_tokens``.

    Exact: greedy output is the target's own; with ``do_sample=True`` the tree's nodes are
    verified as deterministic candidates whose first child at each node is the drafter's draw
    with the target's uniform at that position, so the output is what ``method=None`` samples
    with the same seed. The drafter's layer keeps its own KV cache; after each step the
    accepted tokens are fed to it again with the target's real hidden states. A step that
    drafts nothing runs no drafter pass: its token waits, and the drafter takes the waiting
    tokens in one pass when it next drafts. Every prompt
    token's hidden state is needed at the start, so rows joining a running batch
    (``Batching(max_batch_size=...)``) compute their prompts whole instead of copying a cached
    prefix of a row already there (prompt prefixes shared within a batch still run once).

    Example (``drafter`` from ``specdec.train_eagle`` or ``specdec.EagleDrafter.load``)::

        out = specdec.generate(model, input_ids, method=specdec.Eagle(drafter))
    """

    drafter: EagleDrafter
    tree: str | None = "dynamic"
    top_k: int = 4
    max_draft_tokens: int = 8
    tree_nodes: int = 24
    adaptive: bool = True
    num_speculative_tokens: InitVar[int | None] = None

    def __post_init__(self, num_speculative_tokens: int | None) -> None:
        take_aliases(self, {"num_speculative_tokens": num_speculative_tokens},
                     {"num_speculative_tokens": "max_draft_tokens"})
        if not isinstance(self.drafter, EagleDrafter):
            raise TypeError(f"Eagle: drafter must be a specdec.EagleDrafter, got {type(self.drafter).__name__}")
        if self.tree not in (None, "dynamic"):
            raise ValueError(f'Eagle: tree must be "dynamic" or None (a chain), got {self.tree!r}')
        if self.tree and self.top_k < 2:
            raise ValueError(f"Eagle: a tree needs top_k >= 2 (tree=None is a chain), got {self.top_k}")
        if self.max_draft_tokens < 1 or self.tree_nodes < 1:
            raise ValueError(f"Eagle: max_draft_tokens and tree_nodes must be >= 1, got {self.max_draft_tokens}, "
                             f"{self.tree_nodes}")

    @property
    def branches(self) -> int:
        """Children per expanded node: ``top_k`` for a tree, 1 for a chain."""
        return self.top_k if self.tree == "dynamic" else 1

    @property
    def max_pass_tokens(self) -> int:
        return 1 + (self.tree_nodes if self.branches > 1 else self.max_draft_tokens)

    @property
    def models(self) -> tuple[torch.nn.Module, ...]:
        return (self.drafter.model,)

    @property
    def needs_hidden_states(self) -> bool:
        return True

    @property
    def needs_prompt_hidden_states(self) -> bool:
        return True

    def start(self, target, ctx: Context, prompt: Tensor, prompt_len: Tensor, max_length: int,
              first: StepResult) -> Proposer:
        if first.prompt_hidden is None:
            raise ValueError("Eagle: the drafter needs the target's hidden states at every prompt token "
                             "(StepResult.prompt_hidden), which specdec.generate gives")
        self.drafter.attach(target)
        if is_prepared(target):
            self.drafter.prepare()
        room = max_length + fed_slots(self.branches, self.max_draft_tokens)
        cache = SpecCache.for_model(self.drafter.model, batch_size=prompt.shape[0], max_length=room)
        proposer = _EagleProposer(self, cache)
        # Entry t pairs f_t with x_{t+1}: the prompt's tokens after the first, then the first
        # token emitted, with the hidden states of every prompt token.
        proposer.feed(ctx.tokens[:, 1: prompt.shape[1] + 1], first.prompt_hidden, prompt_len)
        return proposer


class _EagleProposer(Proposer):
    def __init__(self, method: Eagle, cache: SpecCache) -> None:
        self.method, self.drafter, self.cache = method, method.drafter, cache
        self.logp: Tensor | None = None     # [B, V'] the drafter's next-token log-probabilities after the root
        self.feature: Tensor | None = None  # [B, H] its predicted hidden state at the root
        # A tree contains its chain: with ``adaptive``, each step drafts whichever has emitted
        # the most tokens per ms (measured per step). One-token steps are not a shape (as in
        # DraftModel): the chain's calibrated sizing (`grow`) already drafts nothing where
        # nothing pays, and a weak drafter's small gain over one-token steps hides in per-step
        # yields of 0 or 1 token (docs/benchmarks.md).
        self.shape = choice_for(("tree", "chain"), method.adaptive and method.branches > 1)
        self.live = torch.zeros(0)
        self.first: Tensor | None = None  # a tree step's nodes that are the drafter's first choices
        # The drafter's probabilities against what the target accepts (adaptive sizing).
        self.calibration = Calibration() if method.adaptive else None
        self.drafted = False  # whether this step's pass holds drafted nodes
        self.deferred: _Deferred | None = None  # root-only steps' entries, not yet fed

    def feed(self, tokens: Tensor, features: Tensor, count: Tensor) -> None:
        """Commits ``count[b]`` entries per row: tokens ``x_{t+1}`` with the target's hidden
        states ``f_t`` (both right-padded ``[B, W]``, ``[B, W, H]``, W the largest count, at
        least 1); keeps the drafter's prediction after each row's last."""
        logits, hidden = prefill_pass(self.drafter.model, self.cache, tokens, count, self.drafter.logits,
                                      return_hidden=True, inputs_embeds=self.drafter.inputs(tokens, features))
        self.logp, self.feature = logits.float().log_softmax(-1), hidden

    def propose(self, ctx: Context) -> Proposal:
        method = self.method
        shape = self.shape.shapes[self.shape.choose(budgeted=ctx.max_nodes is not None)] if self.shape else None
        branches = method.branches if shape in ("tree", None) else 1
        self.live, self.first = ~ctx.finished, None
        limit = ctx.node_budget(method.tree_nodes if branches > 1 else method.max_draft_tokens)
        self.drafted = limit > 0
        if not self.drafted:
            return Proposal.root_only(ctx.roots())
        self.flush()
        start = time.perf_counter()
        fed: list[Tensor] = []  # the drafter's predicted hidden state at every fed node, by slot

        def feed(tokens: Tensor, mask: Tensor, positions: Tensor, pending: int, parent_slot: Tensor) -> Tensor:
            # A node's entry pairs its parent's predicted hidden state with its token, at its
            # parent's position.
            parents = self.feature[:, None].expand(-1, tokens.shape[1], -1)
            if fed:
                before = torch.cat(fed, 1)
                at = parent_slot.clamp_min(0)[..., None].expand(-1, -1, before.shape[-1])
                parents = torch.where(parent_slot[..., None] >= 0, torch.gather(before, 1, at), parents)
            out = forward_pass(self.drafter.model, self.cache, tokens, attention_mask=mask,
                               position_ids=positions - 1, pending=pending, head=self.drafter.logits,
                               return_hidden=True, inputs_embeds=self.drafter.inputs(tokens, parents))
            fed.append(out.hidden)
            return out.logits.float().log_softmax(-1)

        depth = min(method.max_draft_tokens, limit)
        log_scale = self.calibration.log_scale if self.calibration else 0.0
        tree, n, passes = grow(self.logp, feed, branches, depth, limit, ctx, method.adaptive, self.drafter.vocab_ids,
                               log_scale)
        if ctx.tokens.device.type == "cpu":
            ctx.costs.observe_draft((time.perf_counter() - start) * 1e3 / passes)
        proposal, _, self.first, score = select(tree, n, ctx.roots())
        if self.calibration:
            self.calibration.drafted(proposal, score, log_scale)
        return proposal

    def update(self, ctx: Context, step: StepResult) -> None:
        if self.shape:
            self.shape.emitted(step.accept_len, self.live, self._contained(step))
        if self.calibration:
            self.calibration.verified(step.accept_path, self.live)
        start = self.cache.lengths if self.deferred is None else self.cache.lengths + self.deferred.count
        count = (ctx.lengths - 1 - start).clamp_min(0)
        # The entries of the committed tokens, with the target's hidden states along the
        # accepted path (the drafted ones were fed the drafter's own predictions). A row commits
        # at most its accepted nodes and one more: the root's and theirs (zeros past a row's
        # count: padding).
        path = step.hidden_on_path()
        # A step that drafted nothing needs no drafter pass: its entries (the root's, and in an
        # ensemble the other members' accepted nodes) wait until the drafter next drafts.
        width = max(int(count.max()), 1) if self.drafted else path.shape[1]  # a host read only to feed now
        columns = torch.arange(width, device=start.device)
        tokens = torch.gather(ctx.tokens, 1, (start[:, None] + 1 + columns).clamp_max(ctx.tokens.shape[1] - 1))
        committed = columns < count[:, None]
        features = path[:, :width] * committed[..., None]
        if self.drafted:
            self.feed(tokens, features, count)
        else:
            self.deferred = self.deferred or _Deferred([], [], [], torch.zeros_like(count))
            self.deferred.add(tokens, features, committed)

    def flush(self) -> None:
        """Feed the entries of the steps that drafted nothing since the last that did, in one
        drafter pass."""
        if self.deferred is not None:
            deferred, self.deferred = self.deferred, None
            tokens, features = deferred.entries()
            width = max(int(deferred.count.max()), 1)
            self.feed(tokens[:, :width], features[:, :width], deferred.count)

    def _contained(self, step: StepResult) -> dict[int, Tensor]:
        """What the chain would have had accepted on a tree step: as far as the tree's first
        choices took it."""
        shapes, current = self.shape.shapes, self.shape.current
        if current is None or shapes[current] != "tree":
            return {}
        return {shapes.index("chain"): accepted_within(step.accept_path, self.first)}

    def keep_rows(self, rows: Tensor) -> None:
        self.cache.keep_rows(rows)
        self.logp, self.feature = self.logp[rows], self.feature[rows]
        if self.deferred is not None:
            self.deferred = self.deferred.rows(rows)

    def join(self, other: _EagleProposer) -> None:
        self.flush()
        other.flush()
        self.cache.join(other.cache)
        self.logp = torch.cat([self.logp, other.logp])
        self.feature = torch.cat([self.feature, other.feature])


@dataclass
class _Deferred:
    """Entries of steps that drafted nothing, not yet fed to the drafter: per step, its tokens
    ``[B, W]``, the target's features ``[B, W, H]`` (zero where not committed) and which of them
    each row committed ``[B, W]`` (a prefix)."""

    tokens: list[Tensor]
    features: list[Tensor]
    committed: list[Tensor]
    count: Tensor  # [B] committed entries per row, over the steps

    def add(self, tokens: Tensor, features: Tensor, committed: Tensor) -> None:
        self.tokens.append(tokens)
        self.features.append(features)
        self.committed.append(committed)
        self.count = self.count + committed.sum(1)

    def rows(self, rows: Tensor) -> _Deferred:
        return _Deferred([t[rows] for t in self.tokens], [f[rows] for f in self.features],
                         [c[rows] for c in self.committed], self.count[rows])

    def entries(self) -> tuple[Tensor, Tensor]:
        """Each row's committed entries in order, then padding: tokens ``[B, P]``, features
        ``[B, P, H]`` (zero in the padding)."""
        committed = torch.cat(self.committed, 1)
        order = torch.sort((~committed).to(torch.int8), dim=1, stable=True).indices  # committed first, in order
        features = torch.cat(self.features, 1)
        return (torch.gather(torch.cat(self.tokens, 1), 1, order),
                torch.gather(features, 1, order[..., None].expand(-1, -1, features.shape[-1])))
