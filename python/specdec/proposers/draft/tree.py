"""Token trees from a drafter (`DraftModel(tree="dynamic")`, `Eagle`), grown level by level as EAGLE-2 does.

A step drafts levels 1, 2, ... under the root (the last committed token). Level d + 1 holds the
k most probable children of each of the k most probable nodes of level d (the frontier): one
draft pass over the frontier per level, as many passes as a chain of the same depth, and on a
CPU a draft pass over k <= 6 tokens costs about what a one-token pass does. A node's score is
its path's cumulative draft log-probability, the draft's estimate of the chance that the target
accepts the whole path. The target then verifies the best-scoring nodes of all levels: a child
never scores above its parent, so the chosen nodes always form a tree under the root.

The frontier nodes are written to the draft's cache after its committed entries as they are
drafted (uncommitted, `tree_forward(..., pending=...)`); after the step the entries of the
accepted ones are moved into place (`SpecCache.commit`) instead of being recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from specdec.loop.cost_model import CostModel
from specdec.loop.protocol import Context, Proposal
from specdec.loop.verify import draw
from specdec.loop.random_streams import TOKEN


@dataclass
class DraftedTree:
    """One step's drafted nodes (or one level's), numbered 1.. in the order drafted (0 is the root).

    ``slot[b, i]``: where node i + 1 sits among the step's uncommitted draft-cache entries
    (-1: never fed to the draft)."""

    tokens: Tensor   # [B, M]
    parents: Tensor  # [B, M] node numbers, 0 = root
    score: Tensor    # [B, M] cumulative draft log-probability
    slot: Tensor     # [B, M]


@dataclass
class Calibration:
    """How far a drafter's probabilities overstate what the target accepts, measured as it runs.

    A drafter trained briefly is overconfident (docs/benchmarks.md), and trees sized from its
    scores verify nodes that do not pay. So each step's verified nodes whose parent was
    accepted (those the target tried) are counted: how many it accepted against the drafter's
    summed probability of them, over recent steps (``decay`` per step) on top of ``prior``
    nodes at face value. Their ratio, never above 1, scales each node's probability given its
    parent (`log_scale` is added to its log-probability); a ratio above 1 (an underconfident
    drafter) is not taken, as it would rank a child above its parent. Steps that verify no
    drafted node decay the counts too, so a drafter priced out gets tried again. The counts
    stay on the device: no host read (`grow` reads the scaled scores with its own).

    A proposer calls `drafted` with each proposal it drafts and `verified` after every step.

    Example (steps where the target accepts a quarter of what the drafter predicts):
        >>> cal = Calibration()
        >>> for _ in range(20):
        ...     cal.add(accepted=1.0, predicted=4.0)
        >>> round(float(cal.log_scale.exp()), 2)
        0.27
    """

    prior: float = 1.0
    decay: float = 0.9
    accepted: float | Tensor = 0.0   # decayed sums (0-d tensors once a step is counted)
    predicted: float | Tensor = 0.0
    step: tuple[Proposal, Tensor, float | Tensor] | None = None  # drafted, not yet verified

    @property
    def log_scale(self) -> Tensor:
        """The log of the ratio (at most 0), a 0-d tensor."""
        ratio = torch.as_tensor((self.prior + self.accepted) / (self.prior + self.predicted))
        return ratio.log().clamp(max=0.0)

    def add(self, accepted: float | Tensor, predicted: float | Tensor) -> None:
        """One step's tried nodes: ``accepted`` of them, ``predicted`` their summed probability."""
        self.accepted = self.decay * self.accepted + accepted
        self.predicted = self.decay * self.predicted + predicted

    def drafted(self, proposal: Proposal, score: Tensor, log_scale: float | Tensor) -> None:
        """A step's ``proposal`` (from `select`) and its nodes' scores ``score [B, 1 + n]``,
        drafted with ``log_scale``."""
        self.step = (proposal, score, log_scale)

    def verified(self, accept_path: Tensor, live: Tensor) -> None:
        """Counts the step drafted last, if any: ``accept_path [B, D]`` (the root, the accepted
        nodes, then -1), ``live [B]`` the rows that were decoding."""
        if self.step is None:
            return
        (proposal, score, log_scale), self.step = self.step, None
        parents = proposal.parents[:, 1:].clamp_min(0)
        raw = (score[:, 1:] - torch.gather(score, 1, parents) - log_scale).exp()  # given the parent
        on_path = torch.zeros_like(score, dtype=torch.bool)
        on_path.scatter_(1, accept_path.clamp_min(0), True)  # -1 (none): the root, on every path
        tried = torch.gather(on_path, 1, parents) & live[:, None]
        self.add((on_path[:, 1:] & tried).sum().float(), (raw * tried).sum())


def children(logp: Tensor, k: int, ctx: Context, position: Tensor,
             vocab_ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The k children of each of W nodes ``(ids [B, W, k], log-probabilities [B, W, k])`` from
    their next-token log-probabilities ``logp [B, W, V]``. Greedy: the k most probable. Sampling:
    the draft's draw with the target's uniform at ``position [B]`` first (the token the target
    emits there when the two distributions agree), then the k - 1 most probable others.
    ``vocab_ids [V]``: the ids ``logp``'s columns score (ascending, so that the draw keeps the
    target's order); default: the columns are the ids."""
    if not ctx.sampling.do_sample:
        top = logp.topk(k, -1)
        ids, values = top.indices, top.values
    else:
        W = logp.shape[1]
        first = draw(logp.exp(), ctx.streams, position[:, None].expand(-1, W), TOKEN)[..., None]
        others = logp.scatter(-1, first, float("-inf")).topk(k - 1, -1).indices
        ids = torch.cat([first, others], -1)
        values = torch.gather(logp, -1, ids)
    return (ids if vocab_ids is None else vocab_ids[ids]), values


def fed_slots(k: int, depth: int) -> int:
    """Most frontier nodes a tree of ``depth`` levels feeds to the draft (uncommitted entries)."""
    return (depth - 1) * k


def gains(scores: Tensor, live: Tensor, limit: int) -> Tensor:
    """``[min(M, limit)]``: the expected accepted tokens of the n best nodes of every live row
    (``live [B, 1]``), summed over the rows, for n = 1, 2, ..; ``scores [B, M]`` the nodes'
    cumulative draft log-probabilities, in any order."""
    return (scores.sort(1, descending=True).values[:, :limit].exp() * live).sum(0).cumsum(0)


def best_count(gain: list[float], live: float, passes: int, costs: CostModel) -> tuple[int, float]:
    """How many of the best nodes to verify, and the expected emitted tokens per ms then, from
    `gains` read to the host; ``live`` rows emit one token each whatever is accepted; ``passes``
    draft passes are paid."""
    rates = [(live + g) / (passes * costs.draft_ms_per_token + costs.target(n + 1))
             for n, g in enumerate([0.0, *gain])]
    n = max(range(len(rates)), key=rates.__getitem__)
    return n, rates[n]


def ancestors_row(anc: Tensor, parent_slot: Tensor, slot: Tensor) -> Tensor:
    """The slots a newly fed node sees (its fed ancestors and itself) ``[B, W, F]``, from the
    rows ``anc [B, F, F]`` of the nodes fed before, its parent's slot (-1: the root) and its own."""
    B, W = slot.shape
    n = anc.shape[-1]
    rows = torch.gather(anc, 1, parent_slot.clamp_min(0)[:, :, None].expand(B, W, n))
    rows &= (parent_slot >= 0)[:, :, None]
    return rows | F.one_hot(slot, n).bool()


def select(tree: DraftedTree, n: int, root: Tensor) -> tuple[Proposal, Tensor, Tensor, Tensor]:
    """The proposal of the ``n`` best-scoring nodes (a tree: parents score at least as high and
    were drafted earlier, and the sort is stable), each proposal node's draft slot ``[B, 1 + n]``,
    whether it is the drafter's first choice after its parent ``[B, 1 + n]`` (its argmax, or
    its coupled draw: `children`; the chain a chain drafter drafts runs along these from the
    root, as far as the tree has them: `specdec.loop.shape_choice.accepted_within`), and its
    score ``[B, 1 + n]`` (0 at the root; what `Calibration.drafted` takes).

    Example (nodes 1 and 2 are the root's first and second choices, node 3 node 1's first;
    root token 9):
        >>> tree = DraftedTree(tokens=torch.tensor([[5, 6, 7]]), parents=torch.tensor([[0, 0, 1]]),
        ...                    score=torch.tensor([[-0.1, -2.0, -0.5]]), slot=torch.tensor([[0, -1, -1]]))
        >>> proposal, slots, first, score = select(tree, 2, torch.tensor([[9]]))
        >>> proposal.tokens.tolist(), proposal.parents.tolist(), slots.tolist(), first.tolist()
        ([[9, 5, 7]], [[-1, 0, 1]], [[-1, 0, -1]], [[False, True, True]])
        >>> score.tolist()
        [[0.0, -0.10000000149011612, -0.5]]
    """
    order = torch.sort(tree.score, dim=1, descending=True, stable=True).indices[:, :n]
    B, M = tree.tokens.shape
    # A node's children were drafted together, its first choice first (`grow`).
    numbers = torch.arange(1, M + 1, device=root.device).expand(B, M)
    lowest = torch.full((B, M + 1), M + 1, dtype=torch.long, device=root.device)
    lowest.scatter_reduce_(1, tree.parents, numbers, "amin")
    first = torch.gather(lowest, 1, tree.parents) == numbers
    # Proposal index of every drafted node (0 for those left out: never a chosen node's parent).
    index = torch.zeros(B, M + 1, dtype=torch.long, device=root.device)
    index.scatter_(1, order + 1, torch.arange(1, n + 1, device=root.device).expand(B, n))
    parents = torch.gather(index, 1, torch.gather(tree.parents, 1, order))
    minus_one = torch.full_like(root, -1)
    proposal = Proposal(torch.cat([root, torch.gather(tree.tokens, 1, order)], 1),
                        torch.cat([minus_one, parents], 1))
    return (proposal, torch.cat([minus_one, torch.gather(tree.slot, 1, order)], 1),
            torch.cat([torch.zeros_like(root, dtype=torch.bool), torch.gather(first, 1, order)], 1),
            torch.cat([torch.zeros_like(tree.score[:, :1]), torch.gather(tree.score, 1, order)], 1))


def grow(first: Tensor, feed, k: int, depth: int, limit: int, ctx: Context, adaptive: bool,
         vocab_ids: Tensor | None = None, log_scale: float | Tensor = 0.0) -> tuple[DraftedTree, int, int]:
    """Drafts a tree: ``(tree, nodes to verify, draft passes made)``.

    Args:
        first: ``[B, V]`` the draft's next-token log-probabilities at the root (pass 1).
        feed: ``feed(tokens [B, W], mask [B, W, F + W], positions [B, W], pending F,
            parent_slot [B, W])`` runs the draft over a frontier (its nodes' tokens at their
            positions, slots F .. F + W - 1 after the F fed before; ``parent_slot``: where each
            node's parent was fed, -1 for the root) and returns its log-probabilities
            ``[B, W, V]``.
        k: children per frontier node, and frontier nodes per level.
        depth: most levels; ``limit``: most nodes verified.
        adaptive: grow another level only while the expected emitted tokens per ms rise (the
            draft's scores standing in for acceptance, ``ctx.costs`` for the times), and verify
            the best-paying number of nodes; else ``depth`` levels and ``limit`` nodes.
        vocab_ids: the ids the log-probabilities' columns score (`children`).
        log_scale: added to every node's log-probability given its parent (`Calibration`), so
            that scores estimate what the target accepts.
    """
    B, device = first.shape[0], first.device
    live = (~ctx.finished)[:, None]
    rows = float(live.sum()) if adaptive else 0.0
    root_pos = ctx.lengths - 1
    ids, logp = children(first[:, None], k, ctx, root_pos + 1, vocab_ids)
    levels = [DraftedTree(ids[:, 0], torch.zeros(B, k, dtype=torch.long, device=device), logp[:, 0] + log_scale,
                          torch.full((B, k), -1, dtype=torch.long, device=device))]
    width = fed_slots(k, depth)
    anc = torch.zeros(B, width, width, dtype=torch.bool, device=device)
    fed, drafted, passes = 0, k, 1
    for d in range(1, depth):
        last = levels[-1]
        w = min(k, last.tokens.shape[1])
        sel = last.score.topk(w, -1).indices                      # the frontier, in the last level
        f_score = torch.gather(last.score, 1, sel)
        parent_of = torch.gather(last.parents, 1, sel)
        if adaptive:
            all_scores = torch.cat([lv.score for lv in levels], 1)
            # Each frontier node's best child taken to be as likely as the node was given its parent.
            own = f_score - torch.gather(torch.cat([torch.zeros(B, 1, device=device), all_scores], 1), 1,
                                         parent_of)
            now = gains(all_scores, live, limit)
            both = torch.cat([now, gains(torch.cat([all_scores, f_score + own], 1), live, limit)]).tolist()
            if (best_count(both[len(now):], rows, passes + 1, ctx.costs)[1]  # one host read per level
                    <= best_count(both[:len(now)], rows, passes, ctx.costs)[1]):
                break
        offset = drafted - last.tokens.shape[1]                  # node number of the level's first - 1
        parent_slot = _slot_of(levels, parent_of)
        new_slot = torch.arange(fed, fed + w, device=device).expand(B, w)
        anc[:, fed:fed + w] = ancestors_row(anc, parent_slot, new_slot)
        logp = feed(torch.gather(last.tokens, 1, sel), anc[:, fed:fed + w, :fed + w],
                    (root_pos + d)[:, None].expand(B, w), fed, parent_slot)
        passes += 1
        fed += w
        last.slot.scatter_(1, sel, new_slot)
        ids, lp = children(logp, k, ctx, root_pos + d + 1, vocab_ids)
        levels.append(DraftedTree(ids.reshape(B, w * k),
                                  (offset + 1 + sel)[:, :, None].expand(B, w, k).reshape(B, w * k),
                                  (f_score[:, :, None] + lp + log_scale).reshape(B, w * k),
                                  torch.full((B, w * k), -1, dtype=torch.long, device=device)))
        drafted += w * k
    tree = DraftedTree(*(torch.cat([getattr(lv, f) for lv in levels], 1)
                         for f in ("tokens", "parents", "score", "slot")))
    if adaptive:
        n = best_count(gains(tree.score, live, limit).tolist(), rows, passes, ctx.costs)[0]
    else:
        n = min(limit, drafted)
    return tree, n, passes


def _slot_of(levels: list[DraftedTree], nodes: Tensor) -> Tensor:
    """The draft slot of node numbers ``nodes [B, W]`` (0, the root: -1)."""
    slots = torch.cat([torch.full_like(nodes[:, :1], -1)] + [lv.slot for lv in levels], 1)
    return torch.gather(slots, 1, nodes)
