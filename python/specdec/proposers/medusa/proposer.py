"""Medusa: heads on the target's last hidden state propose a token tree, verified in one pass."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import InitVar, dataclass

import torch
from torch import Tensor

from specdec.loop.protocol import Context, Method, Proposal, Proposer, StepResult
from specdec.renamed import take_aliases
from specdec.proposers.medusa.heads import MedusaHeads
from specdec.loop.cost_model import EXPLORE_EVERY, RunningMean
from specdec.proposers.medusa.trees import StaticTree, best_prefix, cumulative, dynamic_tree, ranked_paths

# An "auto" tree's first step on CPU without measured pass costs: a pass there grows with its
# width (docs/verification.md), and the steps after it are sized from what it measured. On a
# GPU a pass over dozens of tokens costs about one.
UNPROFILED_CPU_NODES = 16


@dataclass
class Medusa(Method):
    """Propose a tree of the Medusa heads' top candidates: head k's top-ranked tokens at depth k
    below the root (the token the target just chose). The heads read the target's final hidden
    state at the last accepted node, which the verify loop hands over from the same pass.

    ``tree``: ``"auto"`` (default) sizes the tree every step: the paths of head ranks, best
    first by the heads' held-out per-rank accuracies (``prior_rank_accuracy`` for heads without
    them), as many as maximise the expected tokens per ms under the target's pass costs as the
    loop measures them (from ``generate(..., pass_costs=...)`` when given; without it, the first
    step on CPU verifies ``UNPROFILED_CPU_NODES`` nodes) and the acceptance measured so far
    (the accuracies scaled by how much the heads actually got accepted). Where no tree pays,
    a step verifies none: one-token decoding, never slower than it but for the heads' cost. A
    list of Medusa choices
    (paths of head ranks, e.g. ``[(0,), (0, 0), (1,)]``) is used as given; ``"dynamic"``
    expands each step by cumulative head log-probability up to ``max_draft_tokens`` nodes.
    ``num_speculative_tokens`` (vLLM's name) is accepted for ``max_draft_tokens``, and
    ``max_nodes`` (its deprecated name).

    Example (``heads`` from ``specdec.train_medusa`` or ``specdec.MedusaHeads.load``)::

        out = specdec.generate(model, input_ids, method=specdec.Medusa(heads))
    """

    heads: MedusaHeads
    tree: str | Sequence[Sequence[int]] = "auto"
    max_draft_tokens: int = 64
    top_k: int = 10
    num_speculative_tokens: InitVar[int | None] = None
    max_nodes: InitVar[int | None] = None

    def __post_init__(self, num_speculative_tokens: int | None, max_nodes: int | None) -> None:
        take_aliases(self, {"num_speculative_tokens": num_speculative_tokens, "max_nodes": max_nodes},
                     {"num_speculative_tokens": "max_draft_tokens", "max_nodes": "max_draft_tokens"},
                     deprecated={"max_nodes"})
        if isinstance(self.tree, str) and self.tree not in ("auto", "dynamic"):
            raise ValueError(f"Medusa: tree must be 'auto', 'dynamic' or a list of choices, got {self.tree!r}")
        if self.max_draft_tokens < 1 or self.top_k < 1:
            raise ValueError(f"Medusa: max_draft_tokens and top_k must be >= 1, got {self.max_draft_tokens}, "
                             f"{self.top_k}")
        if not isinstance(self.tree, str):
            self.tree = StaticTree.from_choices(self.tree)  # validates the paths now

    @property
    def max_pass_tokens(self) -> int:
        if isinstance(self.tree, StaticTree):
            return len(self.tree.parents)
        return 1 + self.max_draft_tokens

    @property
    def needs_hidden_states(self) -> bool:
        return True

    def start(self, target, ctx: Context, prompt: Tensor, prompt_len: Tensor, max_length: int,
              first: StepResult):
        self.heads.attach(target)
        rows, device = ctx.tokens.shape[0], ctx.tokens.device
        if self.tree == "auto":
            proposer = _MedusaProposer(self, None, rows, AutoSize(*ranked_paths(self.accuracy_table(), self.max_draft_tokens)))
        else:
            tree = self.tree.to(device) if isinstance(self.tree, StaticTree) else None
            proposer = _MedusaProposer(self, tree, rows)
        proposer.read(first.hidden[:, 0])
        return proposer

    def accuracy_table(self) -> Tensor:
        """``[K, top_k]`` the heads' held-out per-rank accuracies (a prior without them)."""
        accuracy = self.heads.rank_accuracy
        if accuracy is None:  # e.g. a FasterDecoding/Medusa checkpoint: no held-out table
            accuracy = prior_rank_accuracy(self.heads.config.num_heads, self.top_k)
        return torch.as_tensor(accuracy, dtype=torch.float64)[:, : self.top_k]


def prior_rank_accuracy(num_heads: int, ranks: int) -> Tensor:
    """A stand-in per-rank accuracy table for heads that come without one: head k's rank-0
    candidate right half the time, 0.6x less per later head, and each rank 0.3x the one
    before (the shape of Medusa-1 heads' tables: ours in docs/benchmarks.md, 0.31/0.20/0.14)."""
    k = torch.arange(num_heads, dtype=torch.float64)[:, None]
    r = torch.arange(ranks, dtype=torch.float64)[None]
    return 0.5 * 0.6**k * 0.3**r


class AutoSize:
    """An "auto" tree's size, chosen every step: the first n of the ranked paths, n maximising
    ``(1 + scale * sum of their probabilities) / target(n + 1)``, where ``scale`` is the
    measured accepted tokens over the expected ones (a running mean: held-out accuracies are
    not this text's) and ``target`` the loop's cost model, measured as decoding goes. n = 0
    (no candidates) when nothing pays. Every `EXPLORE_EVERY` steps the held-out table is taken
    at its word again (``scale`` at least 1): a scale measured low on a few unlucky steps would
    otherwise size every later tree at zero, and a tree not proposed is not measured."""

    def __init__(self, paths: list[tuple[int, ...]], probs: list[float]) -> None:
        self.paths = paths
        self.expected = cumulative(probs)
        self.scale = RunningMean()
        self.trees: dict[int, StaticTree] = {}
        self.max_rank = max(max(p) for p in paths)
        self.n = 0  # the last step's size
        self.steps = 0

    def size(self, ctx: Context, limit: int) -> int:
        limit = min(limit, len(self.paths))
        self.steps += ctx.max_nodes != 0  # steps told to propose nothing do not count
        if not ctx.costs.target_ms and ctx.tokens.device.type == "cpu":
            return min(limit, UNPROFILED_CPU_NODES)  # nothing measured yet: this step measures
        scale = 1.0 if self.scale.value is None else self.scale.value
        if self.steps % EXPLORE_EVERY == 0:
            scale = max(scale, 1.0)
        return best_prefix(self.expected[: limit + 1], ctx.costs.target, scale=scale)

    def tree(self, n: int, device: torch.device) -> StaticTree:
        if n not in self.trees:
            self.trees[n] = StaticTree.from_choices(self.paths[:n]).to(device)
        return self.trees[n]

    def observe(self, step: StepResult) -> None:
        """What the rows that proposed got accepted of the last step's ``n`` paths."""
        if self.expected[self.n] <= 0:
            return
        proposed = step.proposal.is_candidate().any(1)
        rows, accepted = torch.stack([proposed.sum(), (step.accept_len * proposed).sum()]).tolist()  # one host read
        if rows:
            self.scale.observe(min(max(accepted / rows / self.expected[self.n], 0.1), 3.0))


class _MedusaProposer(Proposer):
    def __init__(self, method: Medusa, tree: StaticTree | None, rows: int, auto: AutoSize | None = None) -> None:
        self.method, self.tree, self.auto = method, tree, auto
        self.k = auto.max_rank + 1 if auto else method.top_k if tree is None else tree.max_rank + 1
        # A static tree's parents are the same every step: made once per call.
        self.parents = None if tree is None else tree.parents_for(rows, tree.parents.device)
        self.hidden: Tensor | None = None    # [B, H] the hidden state they were read from
        self.ids: Tensor | None = None       # [B, K, k] the heads' candidates for the next step
        self.logprobs: Tensor | None = None  # [B, K, k]

    def read(self, hidden: Tensor) -> None:
        """The heads' candidates from the target's final hidden state ``[B, H]`` at the node
        whose token the target chose last (the new root's predecessor)."""
        self.hidden = hidden
        self.ids, self.logprobs = self.method.heads.topk(hidden, self.k)

    def propose(self, ctx: Context) -> Proposal:
        root = ctx.roots()
        if self.auto is not None:
            n = self.auto.n = self.auto.size(ctx, ctx.node_budget(self.method.max_draft_tokens))
            if n == 0:
                return Proposal.root_only(root)
            tree = self.auto.tree(n, root.device)
            return Proposal(tree.tokens(root[:, 0], self.ids), tree.parents_for(root.shape[0], root.device))
        if self.tree is not None:
            proposal = Proposal(self.tree.tokens(root[:, 0], self.ids), self.parents)
            # Nodes are ordered by depth, so any first nodes form a tree.
            return proposal.narrowed(1 + ctx.node_budget(proposal.width - 1))
        budget = ctx.node_budget(self.method.max_draft_tokens)
        tokens, parents = dynamic_tree(self.logprobs, self.ids, max(budget, 1))  # at least one node
        tokens[:, 0] = root[:, 0]
        return Proposal(tokens, parents).narrowed(1 + budget)

    def update(self, ctx: Context, step: StepResult) -> None:
        if self.auto is not None:
            self.auto.observe(step)
        self.read(step.hidden_at_last())

    def keep_rows(self, rows: Tensor) -> None:
        self.hidden, self.ids, self.logprobs = self.hidden[rows], self.ids[rows], self.logprobs[rows]
        if self.parents is not None:
            self.parents = self.parents[rows]

    def join(self, other: _MedusaProposer) -> None:
        """Appends ``other``'s rows: the heads' candidates read from their prompts' last hidden
        states for this batch's tree (an automatic tree is sized per batch, so theirs may
        differ)."""
        ids, logprobs = self.method.heads.topk(other.hidden, self.k)
        self.hidden = torch.cat([self.hidden, other.hidden])
        self.ids, self.logprobs = torch.cat([self.ids, ids]), torch.cat([self.logprobs, logprobs])
        if self.tree is not None:
            self.parents = self.tree.parents_for(self.ids.shape[0], self.tree.parents.device)
