"""What the verify loop and a method exchange: the proposal of a step, what a proposer may read,
and what a step produced."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.loop.cost_model import CostModel
from specdec.loop.random_streams import RandomStreams
from specdec.loop.sampling import Sampling
from specdec.model.prompt_plan import SharedPrefix


@dataclass
class Proposal:
    """The nodes of one step, all computed in one target pass.

    ``tokens[:, 0]`` is the root (the last committed token); -1 marks a padding node, never
    accepted. On CPU the pass runs only up to each batch's last real node, so padding at the
    end of the rows costs nothing there; on CUDA the shape is kept (fixed shapes for CUDA
    graphs) and padding is computed.

    Candidates (the nodes that may be accepted) form a tree under the root given by
    ``parents``. By default every node is a candidate, attends to its tree ancestors and sits
    at position ``root + depth``. A proposal may instead give its own ``attention_mask``
    (which of the step's nodes each node sees; the committed prefix is always visible) and
    ``position_ids``, and mark with ``candidates`` which nodes are verified: the others are
    computed in the same pass (their logits and hidden states reach the proposer) but never
    accepted; their ``parents`` entries must still be valid (for instance 0).

    ``draft_probs[:, c]`` is the distribution candidate c was drawn from (None: deterministic
    candidates, the usual case).
    """

    tokens: Tensor                           # [B, T] int64
    parents: Tensor                          # [B, T]
    draft_probs: Tensor | None = None        # [B, T, V]
    attention_mask: Tensor | None = None     # [B, T, T] bool
    position_ids: Tensor | None = None       # [B, T] absolute positions
    candidates: Tensor | None = None         # [B, T] bool

    @classmethod
    def root_only(cls, root: Tensor) -> Proposal:
        """The step of the roots ``[B, 1]`` alone: one token per row, nothing to verify."""
        return cls(root, torch.full_like(root, -1))

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    def is_candidate(self) -> Tensor:
        """``[B, T]`` bool: real nodes that may be accepted (the root excluded)."""
        real = self.tokens >= 0
        if self.candidates is not None:
            real = real & self.candidates
        real[:, 0] = False
        return real

    def narrowed(self, width: int) -> Proposal:
        """The first ``width`` nodes (views, no copy)."""
        def cut(t: Tensor | None, dims: int = 1) -> Tensor | None:
            if t is None:
                return None
            return t[:, :width, :width] if dims == 2 else t[:, :width]

        return Proposal(cut(self.tokens), cut(self.parents), cut(self.draft_probs),
                        cut(self.attention_mask, 2), cut(self.position_ids), cut(self.candidates))


@dataclass
class Context:
    """What a proposer may read: the committed tokens of every row (prompt, then output; the last
    one is the root of the next step) and how tokens are chosen.

    ``max_nodes``: most nodes besides the root the proposer may put in this step's pass (0:
    the root alone); None: its own sizing. Set by the loop's pacing of batches and by
    combinators (`specdec.Ensemble`).

    ``shared_prefixes``: groups of rows whose leading prompt tokens the target's prefill computed
    once (`specdec.model.prompt_plan.SharedPrefix`); a proposer with a model of its own prefills the
    same way (`specdec.model.prefill.prefill` with ``shared``).

    ``prefix_donors``: for rows joining a running batch (`generate` with ``max_batch_size``),
    ``(donor [k], reused [k])``: the first ``reused[j]`` prompt tokens of row j are those of the
    batch's row ``donor[j]`` (-1: none), whose cache entries the target copied
    (`specdec.model.prompt_plan.prefix_donors`); a proposer with a model of its own may copy its
    entries too when it joins the batch (`Proposer.join`, `specdec.model.prefill.prefill_from`)."""

    tokens: Tensor            # [B, capacity] committed tokens, left-aligned
    lengths: Tensor           # [B] committed tokens per row
    finished: Tensor          # [B] bool
    sampling: Sampling
    streams: RandomStreams | None  # sampling only: the uniforms of every (row, position)
    costs: CostModel  # target pass costs: profiled, and measured as decoding goes (CPU)
    max_nodes: int | None = None
    shared_prefixes: tuple[SharedPrefix, ...] = ()
    prefix_donors: tuple[Tensor, Tensor] | None = None

    def node_budget(self, wanted: int) -> int:
        """``wanted`` nodes, cut to ``max_nodes``."""
        return wanted if self.max_nodes is None else min(wanted, self.max_nodes)

    def roots(self) -> Tensor:
        """``[B, 1]`` the last committed token of every row."""
        return torch.gather(self.tokens, 1, (self.lengths - 1)[:, None])


@dataclass
class StepResult:
    """What one target pass produced, handed to the proposer after the step (and to ``start``
    for the prefill, as a one-node step whose root is the prompt's last token).

    ``accept_path[b] = [0, n1, .., nk, -1, ..]`` are the root and accepted nodes of
    ``proposal`` (as run: on CPU it may be narrower than proposed), ``accept_len[b] = k``,
    ``next_token[b]`` the token chosen after node nk. ``logits [B, T, V]`` are the target's at
    every node (no copy); ``hidden [B, T, H]`` its final hidden states (after the final norm,
    the LM head's input) from the same pass, when the method asks for them.
    ``last_hidden_state [B, H]`` and ``path_hidden [B, D, H]``: the hidden states at the step's
    last accepted node and at its root and accepted nodes in path order, given when those nodes
    are not all among ``proposal``'s own (a member of an ensemble). ``prompt_hidden [B, N, H]``:
    for ``start``, when the method asks for them, the hidden states at every prompt token
    (zeros past each row's length)."""

    proposal: Proposal
    accept_path: Tensor
    accept_len: Tensor
    next_token: Tensor
    logits: Tensor
    hidden: Tensor | None = None
    last_hidden_state: Tensor | None = None
    path_hidden: Tensor | None = None
    prompt_hidden: Tensor | None = None

    def hidden_at_last(self) -> Tensor:
        """``[B, H]`` the target's final hidden state at each row's last accepted node (the
        node after which ``next_token`` was chosen)."""
        if self.last_hidden_state is not None:
            return self.last_hidden_state
        last = self.last_accepted()
        return self.hidden[torch.arange(last.shape[0], device=last.device), last]

    def hidden_on_path(self) -> Tensor:
        """``[B, D, H]`` the target's final hidden states at the step's root and accepted nodes,
        in path order (entries past ``accept_len + 1`` are those of the root: unused)."""
        if self.path_hidden is not None:
            return self.path_hidden
        path = self.accept_path.clamp_min(0)
        return torch.gather(self.hidden, 1, path[..., None].expand(-1, -1, self.hidden.shape[-1]))

    def last_accepted(self) -> Tensor:
        """``[B]`` the node index of each row's last accepted node (the root when none)."""
        return torch.gather(self.accept_path, 1, self.accept_len[:, None])[:, 0]


class Proposer:
    """The per-call state of a method: proposes each step's nodes and learns from each step.

    Subclass it: ``propose`` is required; ``update`` does nothing by default; ``keep_rows`` and
    ``join`` are optional abilities (a proposer that overrides them lets rows leave and join
    the batch: `generate` with ``drop_finished`` and ``max_batch_size``). ``drops_rows`` and
    ``joins_rows`` say whether it has them; a combinator (`specdec.Ensemble`) answers for its
    members.

    Example:
        >>> class Repeat(Proposer):  # proposes the root token once more, as a chain of one
        ...     def propose(self, ctx):
        ...         roots = ctx.roots()
        ...         return Proposal(torch.cat([roots, roots], 1), torch.tensor([[-1, 0]]).expand(roots.shape[0], 2))
        >>> Repeat().drops_rows, Repeat().joins_rows
        (False, False)
    """

    def propose(self, ctx: Context) -> Proposal:
        """This step's nodes; node 0 of every row is its root (``ctx.roots()``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement propose(ctx)")

    def update(self, ctx: Context, step: StepResult) -> None:
        """Called after each step, with the committed context already advanced."""

    def shadow(self, ctx: Context) -> Tensor | None:
        """The chain ``[B, k]`` (-1 padded) this proposer would propose now, computed from the
        committed text alone and not proposed (no state changes); None (the default) where that
        would take a model pass, or it has none. `specdec.Ensemble`, running another member
        alone, asks its other members for it and learns from the committed text how far it
        would have been accepted."""
        return None

    @property
    def drops_rows(self) -> bool:
        """Whether ``keep_rows`` lets rows that stopped leave the batch."""
        return type(self).keep_rows is not Proposer.keep_rows

    def keep_rows(self, rows: Tensor) -> None:
        """After a step's update: the batch keeps only ``rows`` (indices into it, in their new
        order; the others have finished)."""
        raise NotImplementedError(f"{type(self).__name__} keeps the batch whole")

    @property
    def joins_rows(self) -> bool:
        """Whether ``join`` lets waiting rows join the batch."""
        return type(self).join is not Proposer.join

    def join(self, other: Proposer) -> None:
        """Between steps: appends the rows of ``other``, a proposer of the same method started
        (``Method.start``) on rows that join the batch, after this one's (`generate` with
        ``max_batch_size``: requests taking the places of rows that stopped)."""
        raise NotImplementedError(f"{type(self).__name__} takes no rows mid-run")


class Method:
    """A speculative decoding method: how to build its proposer for one `generate` call.

    Subclass it: ``max_pass_tokens`` and ``start`` are required; a method with models of its
    own lists them in ``models`` (they get tree attention too), and one that reads the target's
    final hidden states sets ``needs_hidden_states``."""

    @property
    def max_pass_tokens(self) -> int:
        """Most nodes one step's pass may hold (root, candidates and any other nodes)."""
        raise NotImplementedError(f"{type(self).__name__} must define max_pass_tokens")

    @property
    def models(self) -> tuple[torch.nn.Module, ...]:
        """Models the method runs besides the target."""
        return ()

    @property
    def needs_hidden_states(self) -> bool:
        """Whether steps hand the target's final hidden states to the proposer."""
        return False

    @property
    def needs_prompt_hidden_states(self) -> bool:
        """Whether ``start`` gets the target's final hidden states at every prompt token
        (``StepResult.prompt_hidden``). Rows joining a running batch then compute their
        prompts whole, without copying a row's cached prefix (shared prefixes within a batch
        still run once)."""
        return False

    def start(self, target: torch.nn.Module, ctx: Context, prompt: Tensor, prompt_len: Tensor,
              max_length: int, first: StepResult) -> Proposer:
        """The proposer for one call; ``first`` is the prefill's result (the first token
        emitted, the logits and hidden state at each row's last prompt token)."""
        raise NotImplementedError(f"{type(self).__name__} must implement start(...)")
