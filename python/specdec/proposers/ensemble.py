"""Ensembles of proposers: several methods' candidates verified in one target pass.

``mix="union"``: every member proposes for the same root; the candidate trees are merged into
one trie (equal token paths become one node) and verified in one pass; nodes a member computes
without verifying them (lookahead's window) ride along with their own attention pattern and
positions. After the step each member learns what happened in its own node numbering, as if it
had run alone (how far its own tree was accepted, its nodes' logits), plus the hidden state at
the step's true last accepted node. With ``adaptive=True`` the members form a cascade: the
first always proposes; each later one proposes only where, from what it added beyond the
members before it (measured per step from the committed text), its own cost (measured) and
the wider pass (the measured pass-cost curve), it is expected to raise the emitted tokens per
ms. So cheap lookup candidates come first and a draft model drafts where lookup has nothing.

``mix="average"``: draft models drafting together from the mean of their distributions (that
mean is the q of lossless rejection sampling).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from specdec import ops
from specdec.loop.cost_model import EXPLORE_EVERY, CostModel, RunningMean
from specdec.proposers.draft.method import DraftModel
from specdec.proposers.draft.proposer import draft_proposer
from specdec.loop.protocol import Context, Method, Proposal, Proposer, StepResult
from specdec.loop.shape_choice import choice_for
from specdec.model.forward import node_layout
from specdec.proposers.copy_chain import matched
from specdec.proposers.merge import merge_paths

MIXES = ("union", "average")
# Steps a later member is measured in a state before the cascade may skip it there.
MIN_SAMPLES = 3
# What a later member adds depends on what the earlier ones proposed: nothing, a short guess,
# or a long copy (prompt lookup proposes long chains where text is being copied).
STATES = (0, 1, 2)


def _state(nodes: int) -> int:
    """The state of a step whose earlier members proposed ``nodes`` nodes: 0 none, 1 up to 4, 2 more."""
    return 0 if nodes == 0 else 1 if nodes <= 4 else 2


@dataclass(init=False)
class Ensemble(Method):
    """Several proposers' candidates verified in one target pass.

    Args:
        *members: the methods (``DraftModel``, ``PromptLookup``, ``Medusa``, ``Lookahead``,
            another ``Ensemble``), cheapest first for ``adaptive``.
        mix: ``"union"`` (default): one tree of every member's candidates, shared prefixes
            merged. ``"average"``: draft models only; they draft one chain from the mean of
            their distributions (lengths, adaptivity and coupling of the first member).
        adaptive: union only; members after the first propose only in steps where they are
            expected to pay (see the module's docstring), and each step is the union or one
            member alone, whichever has emitted more tokens per ms so far (measured per step,
            the members' tokens on the union's steps too: `specdec.loop.shape_choice`); False: every
            member every step.

    Greedy output equals the target's greedy output and sampling is lossless, as for each
    member: union members' candidates must be deterministic (draft models with
    ``coupled=True``, the default), so that siblings from different members can be verified
    together; with ``mix="average"`` a ``coupled=False`` chain is verified by rejection
    sampling against the mixture.

    Example (``draft`` and ``model`` Hugging Face causal LMs sharing a tokenizer)::

        hybrid = specdec.Ensemble(specdec.PromptLookup(), specdec.DraftModel(draft, adaptive=True))
        out = specdec.generate(model, input_ids, method=hybrid)
    """

    members: tuple[Method, ...]
    mix: str
    adaptive: bool

    def __init__(self, *members: Method, mix: str = "union", adaptive: bool = True) -> None:
        if not members:
            raise ValueError("Ensemble: no members (give at least one method, e.g. "
                             "Ensemble(PromptLookup(), DraftModel(draft)))")
        for m in members:
            if not isinstance(m, Method):
                raise TypeError(f"Ensemble: {m!r} is not a method (DraftModel, PromptLookup, Medusa, "
                                "Lookahead or Ensemble)")
        if mix not in MIXES:
            raise ValueError(f"Ensemble: mix must be one of {MIXES}, got {mix!r}")
        if mix == "average":
            others = [type(m).__name__ for m in members if not isinstance(m, DraftModel)]
            if others:
                raise ValueError(f"Ensemble(mix='average') averages draft models' distributions; got {others}")
            for name in ("num_draft_tokens", "adaptive", "max_draft_tokens", "coupled"):
                values = {getattr(m, name) for m in members}
                if len(values) > 1:
                    raise ValueError(f"Ensemble(mix='average'): the drafts draft one chain together, so "
                                     f"their {name} must agree, got {sorted(values, key=str)}")
        self.members, self.mix, self.adaptive = tuple(members), mix, adaptive

    @property
    def max_pass_tokens(self) -> int:
        if self.mix == "average":
            return self.members[0].max_pass_tokens
        return 1 + sum(m.max_pass_tokens - 1 for m in self.members)

    @property
    def models(self) -> tuple[torch.nn.Module, ...]:
        return tuple(model for m in self.members for model in m.models)

    @property
    def needs_hidden_states(self) -> bool:
        return any(m.needs_hidden_states for m in self.members)

    @property
    def needs_prompt_hidden_states(self) -> bool:
        return any(m.needs_prompt_hidden_states for m in self.members)

    def start(self, target, ctx: Context, prompt: Tensor, prompt_len: Tensor, max_length: int,
              first: StepResult) -> Proposer:
        if self.mix == "average":
            return draft_proposer(self.members, target, prompt, prompt_len, max_length, ctx.shared_prefixes,
                                  ctx.prefix_donors)
        # Each member prices its own drafting: the target's costs are shared, a draft's are not.
        costs = [dataclasses.replace(ctx.costs, draft_ms_per_token=0.0) for _ in self.members]
        proposers = [m.start(target, dataclasses.replace(ctx, costs=c), prompt, prompt_len, max_length, first)
                     for m, c in zip(self.members, costs)]
        return _UnionProposer(self, proposers, costs)


class _UnionProposer(Proposer):
    def __init__(self, method: Ensemble, proposers: list[Proposer], costs: list[CostModel]) -> None:
        self.method, self.proposers, self.costs = method, proposers, costs
        self.steps = 0
        n = len(proposers)
        # Per member and state (how much the members before it proposed, `_state`): tokens
        # emitted without it, tokens it added, nodes it added; and its ms per proposal.
        self.base, self.gain, self.nodes = ([[RunningMean() for _ in STATES] for _ in range(n)] for _ in range(3))
        self.ms = [RunningMean() for _ in range(n)]
        # An ensemble contains each member: each step the union, or the member that has emitted
        # the most tokens per ms alone, whichever has so far (measured per step; the members'
        # tokens on the union's steps too).
        names = tuple(type(m).__name__ for m in method.members)
        self.shape = choice_for(("union", *names), method.adaptive and n > 1)
        self.proposals: list[Proposal] = []
        # While one member runs alone, the others' shadow chains (`Proposer.shadow`): member,
        # chain [B, k], the committed lengths then.
        self.shadows: list[tuple[int, Tensor, Tensor]] = []
        self.index: list[Tensor] = []
        self.called: list[bool] = []
        self.states: list[int] = []
        self.added: list[int] = [0] * n
        self.live = torch.zeros(0)

    def _pays(self, j: int, state: int, width: int, costs: CostModel) -> bool:
        """Whether member j, after members proposing ``width`` nodes, is expected to raise the
        emitted tokens per ms (True until measured on ``MIN_SAMPLES`` steps: one unlucky step
        would otherwise stop a member until the next exploration)."""
        if self.base[j][state].count < MIN_SAMPLES:
            return True
        base, gain, nodes = (x[j][state].value for x in (self.base, self.gain, self.nodes))
        cost = costs.target
        return (base + gain) / (cost(width + nodes) + (self.ms[j].value or 0.0)) > base / cost(width)

    def propose(self, ctx: Context) -> Proposal:
        self.steps += ctx.max_nodes != 0  # steps told to propose nothing do not count
        explore = not self.method.adaptive or self.steps % EXPLORE_EVERY == 0
        alone = (self.shape.choose(budgeted=ctx.max_nodes is not None) if self.shape else 0) - 1
        on_cpu = ctx.tokens.device.type == "cpu"
        self.proposals, self.called, self.states, self.shadows = [], [], [], []
        width = 1  # nodes so far (an upper bound: members' trees may share nodes)
        for j, proposer in enumerate(self.proposers):
            state = _state(width - 1)
            if alone >= 0:
                call = j == alone
            else:
                call = j == 0 or explore or self._pays(j, state, width, ctx.costs)
            # A member sizes its nodes for the pass it shares: the batch's rows, the earlier
            # members' nodes of this step and what the later ones added last step (none when
            # it proposes alone: the later ones propose nothing then).
            self.costs[j].rows = ctx.costs.rows
            self.costs[j].extra = width - 1 + (sum(self.added[j + 1:]) if alone < 0 else 0)
            room = None if ctx.max_nodes is None else max(ctx.max_nodes - (width - 1), 0)
            start = time.perf_counter()
            proposal = proposer.propose(dataclasses.replace(ctx, costs=self.costs[j],
                                                            max_nodes=room if call else 0))
            if call and on_cpu:  # elsewhere the work is asynchronous: not measured
                self.ms[j].observe((time.perf_counter() - start) * 1e3)
            if 0 <= alone != j:  # another member runs alone: what this one would have proposed
                chain = proposer.shadow(dataclasses.replace(ctx, costs=self.costs[j]))
                if chain is not None:
                    self.shadows.append((j, chain, ctx.lengths.clone()))
            if proposal.draft_probs is not None:
                raise ValueError("Ensemble(mix='union') verifies deterministic candidates only: use "
                                 "DraftModel(coupled=True) (the default) in an ensemble")
            width += int((proposal.tokens[:, 1:] >= 0).sum(1).max())
            self.proposals.append(proposal)
            self.called.append(call)
            self.states.append(state)
        merged, self.index, self.added = merge_proposals(self.proposals, ctx.lengths - 1)
        self.live = ~ctx.finished
        return merged

    @property
    def drops_rows(self) -> bool:
        return all(p.drops_rows for p in self.proposers)

    def keep_rows(self, rows: Tensor) -> None:
        for proposer in self.proposers:
            proposer.keep_rows(rows)

    @property
    def joins_rows(self) -> bool:
        return all(p.joins_rows for p in self.proposers)

    def join(self, other: _UnionProposer) -> None:
        for proposer, theirs in zip(self.proposers, other.proposers):
            proposer.join(theirs)

    def update(self, ctx: Context, step: StepResult) -> None:
        steps = member_steps(step, self.proposals, self.index)
        for proposer, costs, own in zip(self.proposers, self.costs, steps):
            proposer.update(dataclasses.replace(ctx, costs=costs), own)
        if self.shape:
            # A union step tells what each member that proposed in it would have emitted alone
            # (as far as its own tree went: alone it may size it for a narrower pass).
            # A step of one member alone tells at least how far the others' shadow chains would
            # have been accepted: as far as they match what it committed.
            union = self.shape.current == 0
            self.shape.emitted(step.accept_len, self.live,
                               {j + 1: own.accept_len for j, own in enumerate(steps) if union and self.called[j]},
                               {j + 1: matched(chain[:, None], ctx, start, step.accept_len + 1)[:, 0]
                                for j, chain, start in self.shadows})
        if not self.method.adaptive or len(self.proposers) == 1:
            return
        # What each called member added beyond the members before it, over the live rows.
        accepted = torch.stack([s.accept_len for s in steps], 1)[self.live].double()
        if accepted.shape[0] == 0:
            return
        before = torch.cat([torch.zeros_like(accepted[:, :1]), accepted.cummax(1).values[:, :-1]], 1)
        gains = (accepted - before).clamp_min(0).mean(0).tolist()  # one host read
        bases = (1 + before).mean(0).tolist()
        for j in range(1, len(self.proposers)):
            if self.called[j]:
                s = self.states[j]
                self.base[j][s].observe(bases[j])
                self.gain[j][s].observe(gains[j])
                self.nodes[j][s].observe(self.added[j])


def merge_proposals(proposals: list[Proposal], root_position: Tensor) -> tuple[Proposal, list[Tensor], list[int]]:
    """One proposal from several over the same root (``root_position [B]`` its position).

    Candidates (which see their tree ancestors, as every method's do): one trie
    (:func:`specdec.proposers.merge.merge_paths`), first. Then each member's
    non-candidate nodes, seeing the merged counterparts of the nodes they saw, at their own
    positions. Returns the proposal, per member where each of its nodes went ``[B, T_j]`` (-1:
    padding) and how many nodes each member added beyond the members before it (most over the
    rows; one host read)."""
    root = proposals[0].tokens[:, :1]
    tokens, parents, offset = [root], [torch.full_like(root, -1)], 1
    for p in proposals:
        own = torch.where(p.is_candidate(), p.tokens, -1)[:, 1:]
        # Member node i >= 1 sits at offset + i - 1; the root stays 0.
        tokens.append(own)
        parents.append(torch.where(p.parents[:, 1:] > 0, p.parents[:, 1:] + offset - 1, 0))
        offset += p.width - 1
    trie, trie_parents, index = merge_paths(torch.cat(tokens, 1), torch.cat(parents, 1))
    B, M = trie.shape
    index = list(index.split([1] + [p.width - 1 for p in proposals], 1))
    index = [torch.cat([index[0], i], 1) for i in index[1:]]

    # Non-candidate nodes, appended after the trie (columns where some row has one).
    extra = [((p.tokens >= 0) & ~p.is_candidate()) for p in proposals]
    for e in extra:
        e[:, 0] = False
    columns = [e.any(0).nonzero()[:, 0] for e in extra]
    appended = sum(len(c) for c in columns)
    layout = appended or any(p.attention_mask is not None or p.position_ids is not None for p in proposals)
    if not layout:
        return Proposal(trie, trie_parents), index, _added(index, B, M)

    T = M + appended
    mask = torch.zeros((B, T, T + 1), dtype=torch.uint8, device=trie.device)  # last column: spare
    trie_mask, depth, _ = ops.build_tree(trie_parents, max_leaves=1, max_depth=0)
    mask[:, :M, :M] = trie_mask
    positions = torch.cat([root_position[:, None] + depth, root_position.new_zeros((B, appended))], 1)
    all_tokens = torch.cat([trie, trie.new_full((B, appended), -1)], 1)
    all_parents = torch.cat([trie_parents, trie_parents.new_zeros((B, appended))], 1)
    at = M
    for p, e, cols, i in zip(proposals, extra, columns, index):
        if len(cols) == 0:
            continue
        n = len(cols)
        slots = torch.arange(at, at + n, device=trie.device)
        i[:, cols] = torch.where(e[:, cols], slots, i[:, cols])
        member_mask, member_positions = node_layout(p.parents, root_position, p.attention_mask, p.position_ids)
        seen = torch.where(i >= 0, i, T)[:, None, :].expand(B, n, -1)
        mask[:, at:at + n].scatter_reduce_(2, seen, member_mask[:, cols].to(torch.uint8), "amax")
        all_tokens[:, at:at + n] = torch.where(e[:, cols], p.tokens[:, cols], -1)
        positions[:, at:at + n] = member_positions[:, cols]
        at += n
    candidates = torch.zeros((B, T), dtype=torch.bool, device=trie.device)
    candidates[:, :M] = True
    return (Proposal(all_tokens, all_parents, attention_mask=mask[:, :, :T].bool(), position_ids=positions,
                     candidates=candidates), index, _added(index, B, T))


def _added(index: list[Tensor], B: int, T: int) -> list[int]:
    """Per member, the most nodes (over the rows) that it placed first (not shared with an
    earlier member)."""
    owner = torch.full((B, T + 1), len(index), dtype=torch.long, device=index[0].device)
    for j in reversed(range(len(index))):
        owner.scatter_(1, torch.where(index[j] >= 0, index[j], T), j)
    owner[:, 0] = -1  # the root belongs to no one
    counts = torch.stack([(owner[:, :T] == j).sum(1) for j in range(len(index))], 1)
    return counts.amax(0).tolist()


def member_steps(step: StepResult, proposals: list[Proposal], index: list[Tensor]) -> list[StepResult]:
    """The step as each member would see it in its own node numbering: how far its own tree
    was accepted, the token chosen after its last accepted node, its nodes' logits and hidden
    states, and the hidden states at the step's true last accepted node and along its path."""
    path, n, merged = step.accept_path, step.accept_len, step.proposal
    B, D = path.shape
    T = merged.width
    on_path = torch.zeros((B, T + 1), dtype=torch.bool, device=path.device)
    on_path.scatter_(1, torch.where(path >= 0, path, T), True)
    depth = torch.full((B, T + 1), D, dtype=torch.long, device=path.device)  # D: not on the path
    depth.scatter_(1, torch.where(path >= 0, path, T), torch.arange(D, device=path.device).expand(B, D))
    last_hidden = step.hidden_at_last() if step.hidden is not None else None
    path_hidden = step.hidden_on_path() if step.hidden is not None else None
    rows = torch.arange(B, device=path.device)[:, None]
    out = []
    for p, i in zip(proposals, index):
        at = i.clamp(0, T - 1)
        accepted = p.is_candidate() & (i >= 0) & torch.gather(on_path, 1, i.clamp_min(0).clamp_max(T))
        slot = torch.where(accepted, torch.gather(depth, 1, i.clamp_min(0).clamp_max(T)), D)
        own_path = torch.full((B, D + 1), -1, dtype=path.dtype, device=path.device)
        own_path.scatter_(1, slot, torch.arange(p.width, device=path.device, dtype=path.dtype).expand(B, -1))
        own_path = own_path[:, :D]
        own_path[:, 0] = 0
        own_n = (own_path[:, 1:] >= 0).sum(1).to(n.dtype)
        # The token after its last accepted node: the next node of the step's path, or next_token.
        after = torch.gather(path, 1, (own_n + 1).clamp_max(D - 1)[:, None].long())[:, 0]
        own_next = torch.where(own_n == n, step.next_token,
                               torch.gather(merged.tokens, 1, after.clamp_min(0)[:, None])[:, 0])
        out.append(StepResult(p, own_path, own_n, own_next, step.logits[rows, at],
                              None if step.hidden is None else step.hidden[rows, at], last_hidden, path_hidden))
    return out
