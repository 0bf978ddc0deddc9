"""Lookahead decoding (Fu et al., 2024): a Jacobi window and an n-gram pool, in one target pass.

No draft model and no training. Each step the target runs once over three groups of nodes:

- the root (the last committed token, at position p - 1);
- the verification branch: up to G n-grams from the row's pool whose first token is the root,
  and prompt lookup's candidates (a longer copy of what followed the earliest earlier
  occurrence of the context's longest suffix n-gram, and its side branches), merged into a
  trie (candidates, verified as a tree);
- the lookahead window: N - 1 levels by W columns of guessed tokens, never verified. Level l of
  column j sits at position p + j + l and sees the root, level 0 of columns 0..j and levels
  1..l of its own column: a contiguous context, so its logits guess the token after it.

From the window's logits the top level's argmax gives each column a new level; a full column
(N - 1 levels and the new token) is an n-gram of N tokens that goes into the pool, and the
column shifts up one level. The window starts from random prompt tokens (level 0) and fills
one level per step.
"""

from __future__ import annotations

import functools
from dataclasses import InitVar, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from specdec import ops
from specdec.renamed import take_aliases
from specdec.loop.cost_model import EXPLORE_EVERY
from specdec.loop.shape_choice import choice_for
from specdec.proposers.copy_chain import matched
from specdec.proposers.prompt_lookup import PromptLookup, LookupProposer
from specdec.loop.protocol import Context, Method, Proposal, Proposer, StepResult
from specdec.ops.ngram_pool import NGramPool
from specdec.proposers.merge import merge_chains


@dataclass
class Lookahead(Method):
    """Lookahead decoding: verify n-grams from a per-row pool while a Jacobi window, computed
    in the same target pass, keeps producing new n-grams for it.

    Args:
        window: W, columns of the lookahead window.
        ngram: N, the n-gram length (the window has N - 1 levels; a verified n-gram proposes
            up to N - 1 tokens).
        guess_set: G, most n-grams verified per step (and kept per key token in the pool).
        pool_from_prompt: also fill the pool with the prompt's n-grams and with the output's
            as it is committed; False: the window's n-grams only, as in the reference
            implementation.
        max_draft_tokens: most tokens of the copy from the context verified with the n-grams
            (an n-gram proposes at most N - 1 tokens; edited code repeats whole lines); 0: none.
            With ``pool_from_prompt=False`` and ``max_draft_tokens=0`` the candidates are the
            reference's. ``num_speculative_tokens`` (vLLM's name) is accepted for it, and
            ``copy_tokens`` (its deprecated name).
        side_tokens: the copy's side branches, as :class:`PromptLookup`'s (a repeated line, a
            copy going on after one changed token); with ``adaptive`` only where they pay. So
            lookahead verifies what prompt lookup would, and the pool's n-grams besides.
        adaptive: size each step from the target's pass costs and the pool's recent hits:
            the guesses that maximise expected tokens per ms, and window columns only as far
            as they cost at most half of what the guesses currently add (on a GPU, where a
            pass over a hundred tokens costs about one, that is always the whole window);
            and each step either that or prompt lookup's candidates alone, whichever has
            emitted more tokens per ms so far (measured per step, prompt lookup's tokens on
            lookahead's steps too: `specdec.loop.shape_choice`). False: always W columns and G guesses.
        seed: picks the prompt tokens that start the window (reproducible runs).

    Greedy output equals the target's greedy output; sampling is lossless (the n-grams are
    deterministic candidates; the window is never verified).

    Example (``model`` a Hugging Face causal LM)::

        out = specdec.generate(model, input_ids, method=specdec.Lookahead(window=5, ngram=4))
    """

    window: int = 5
    ngram: int = 4
    guess_set: int = 5
    pool_from_prompt: bool = True
    max_draft_tokens: int = 32
    side_tokens: int = 4
    adaptive: bool = True
    seed: int = 0
    num_speculative_tokens: InitVar[int | None] = None
    copy_tokens: InitVar[int | None] = None

    def __post_init__(self, num_speculative_tokens: int | None, copy_tokens: int | None) -> None:
        take_aliases(self, {"num_speculative_tokens": num_speculative_tokens, "copy_tokens": copy_tokens},
                     {"num_speculative_tokens": "max_draft_tokens", "copy_tokens": "max_draft_tokens"},
                     deprecated={"copy_tokens"})
        if self.window < 1:
            raise ValueError(f"Lookahead: window must be >= 1, got {self.window}")
        if self.ngram < 2:
            raise ValueError(f"Lookahead: ngram must be >= 2 (a key token and a continuation), got {self.ngram}")
        if self.guess_set < 0:
            raise ValueError(f"Lookahead: guess_set must be >= 0, got {self.guess_set}")
        if self.max_draft_tokens < 0:
            raise ValueError(f"Lookahead: max_draft_tokens must be >= 0, got {self.max_draft_tokens}")
        if self.side_tokens < 0:
            raise ValueError(f"Lookahead: side_tokens must be >= 0, got {self.side_tokens}")

    @property
    def max_pass_tokens(self) -> int:
        copy = self.max_draft_tokens + 2 * min(self.side_tokens, self.max_draft_tokens)
        return 1 + (self.window + self.guess_set) * (self.ngram - 1) + copy

    def start(self, target, ctx: Context, prompt: Tensor, prompt_len: Tensor, max_length: int,
              first: StepResult):
        B, device = ctx.tokens.shape[0], ctx.tokens.device
        # A row inserts its prompt's n-grams, then per step `ngram` committed ones and one per
        # window column, over fewer steps than the context is wide: a ring of that size never
        # wraps (nor would the default's), and a large batch does not hold the default's 64k
        # slots per row. Rows joining later start with the same width, so their pools join.
        width = ctx.tokens.shape[1]
        capacity = min(NGramPool.DEFAULT_CAPACITY, width * (1 + self.ngram + self.window))
        pool = NGramPool(B, first.logits.shape[-1], self.ngram, max(self.guess_set, 1), device,
                         capacity=capacity)
        lookup = None
        if self.max_draft_tokens:
            lookup = PromptLookup(num_draft_tokens=self.max_draft_tokens, adaptive=self.adaptive,
                                  max_draft_tokens=self.max_draft_tokens, side_tokens=self.side_tokens)
            lookup = lookup.start(target, ctx, prompt, prompt_len, max_length, first)
        proposer = _LookaheadProposer(self, pool, _initial_window(self, prompt, prompt_len), lookup)
        if self.pool_from_prompt:  # every n-gram of the prompt and the first emitted token
            proposer.insert_context(ctx, torch.full_like(prompt_len, self.ngram - 1),
                                    int(prompt_len.max()) + 2 - self.ngram)
        return proposer


def _initial_window(method: Lookahead, prompt: Tensor, prompt_len: Tensor) -> Tensor:
    """``[B, N - 1, W]``: level 0 random tokens of each row's prompt, the other levels empty."""
    B = prompt.shape[0]
    generator = torch.Generator().manual_seed(method.seed)
    picks = (torch.rand(B, method.window, generator=generator, dtype=torch.float64).to(prompt.device)
             * prompt_len[:, None]).long()
    levels = torch.full((B, method.ngram - 1, method.window), -1, dtype=torch.long, device=prompt.device)
    levels[:, 0] = torch.gather(prompt, 1, picks)
    return levels


@functools.lru_cache(maxsize=256)
def _window_layout(fill: tuple[int, ...]) -> tuple[list[int], list[int], Tensor, Tensor]:
    """Levels, columns, mask ``[n, n]`` among the window's n nodes and position offsets after
    the root, for columns with ``fill[j]`` levels each (level-major node order)."""
    nodes = [(l, j) for l in range(max(fill, default=0)) for j in range(len(fill)) if l < fill[j]]
    levels = [l for l, _ in nodes]
    columns = [j for _, j in nodes]
    mask = torch.tensor([[(l2 == 0 and j2 <= j) or (j2 == j and 0 < l2 <= l) for l2, j2 in nodes]
                         for l, j in nodes], dtype=torch.bool).reshape(len(nodes), len(nodes))
    offsets = torch.tensor([1 + j + l for l, j in nodes], dtype=torch.long)
    return levels, columns, mask, offsets


class _LookaheadProposer(Proposer):
    def __init__(self, method: Lookahead, pool: NGramPool, levels: Tensor,
                 lookup: LookupProposer | None) -> None:
        self.method, self.pool, self.levels, self.lookup = method, pool, levels, lookup
        self.fill = [1] * method.window  # filled levels per column (the same for every row)
        g = method.guess_set
        # Expected tokens the first g guesses add to prompt lookup's (a prior until measured).
        self.hit = [min(1.0, 0.2 * i) for i in range(g + 1)]
        self.steps = 0
        # Lookahead contains prompt lookup: where the pool's guesses and the window do not pay
        # for themselves (measured per step), prompt lookup's candidates alone.
        self.shape = choice_for(("lookahead", "lookup"), method.adaptive and lookup is not None)
        self.guesses: Tensor | None = None  # [B, g, N - 1] verified this step
        self.columns = 0                    # window columns run this step
        self.window_start = 0               # the window's first node index
        self.start = torch.zeros(0)         # committed lengths when proposed
        self.live = torch.zeros(0)

    def insert_context(self, ctx: Context, first_end: Tensor, count: int) -> None:
        """Inserts the committed n-grams ending at positions ``first_end[b] .. + count - 1``
        (those that exist)."""
        n = self.method.ngram
        if count < 1:
            return
        ends = first_end[:, None] + torch.arange(count, device=first_end.device)
        index = ends[:, :, None] + torch.arange(1 - n, 1, device=ends.device)
        valid = (index[:, :, 0] >= 0) & (ends < ctx.lengths[:, None])
        grams = torch.gather(ctx.tokens, 1, index.clamp(0, ctx.tokens.shape[1] - 1).flatten(1))
        self.pool.insert(torch.where(valid[:, :, None], grams.view(index.shape), -1))

    def _sizes(self, ctx: Context, copied: int) -> tuple[int, int]:
        """(guesses, window columns) of this step, next to prompt lookup's ``copied`` nodes,
        within the context's node budget."""
        m = self.method
        n1, cost = m.ngram - 1, ctx.costs.target
        room = ctx.node_budget(m.max_pass_tokens) - copied  # nodes left besides the root and copy
        guesses = min(m.guess_set, room // n1)

        def columns_within(nodes: int) -> int:  # the most columns whose levels fit in ``nodes``
            return next((w for w in range(m.window, -1, -1) if sum(self.fill[:w]) <= nodes), 0)

        if not m.adaptive:
            return guesses, columns_within(room - guesses * n1)
        base = self.lookup.expected() if copied else 1.0  # tokens without guesses
        g = max(range(guesses + 1), key=lambda i: (base + self.hit[i]) / cost(1 + copied + i * n1))
        explore = self.steps % EXPLORE_EVERY == 0
        if explore:  # one guess more than pays, so its hits are measured (not all G: they cost)
            g = min(g + 1, guesses)
        # The window pays through the pool: it may cost at most half of what the pool's guesses
        # add (the other half is kept); prompt lookup's tokens do not come from the window.
        verified = 1 + copied + g * n1
        budget = cost(verified) * (1 + 0.5 * max(self.hit[g], 0.1))
        w = 0
        while w < m.window and cost(verified + sum(self.fill[: w + 1])) <= budget:
            w += 1
        # Where no column pays, the window still runs one column every few steps to keep filling.
        return g, min(max(w, int(explore)), columns_within(room - g * n1))

    def propose(self, ctx: Context) -> Proposal:
        self.steps += ctx.max_nodes != 0  # steps told to propose nothing do not count
        root = ctx.roots()
        copy = self.lookup.chains(ctx) if self.lookup else None
        shape = self.shape.choose(budgeted=ctx.max_nodes is not None) if self.shape else 0
        g, w = self._sizes(ctx, 0 if copy is None else self.lookup.nodes) if shape == 0 else (0, 0)
        self.guesses = self.pool.lookup(root[:, 0])[0][:, :g] if g else None
        chains = [c for c in (copy, self.guesses) if c is not None]
        tokens, parents = root, torch.full_like(root, -1)
        if chains:
            k = max(c.shape[-1] for c in chains)
            chains = [F.pad(c, (0, k - c.shape[-1]), value=-1) for c in chains]
            tokens, parents = merge_chains(root, torch.cat(chains, 1))
        self.start, self.live, self.columns = ctx.lengths.clone(), ~ctx.finished, w
        self.window_start = M = tokens.shape[1]

        levels, columns, block, offsets = _window_layout(tuple(self.fill[:w]))
        device, B, n = root.device, root.shape[0], len(levels)
        window = self.levels[:, levels, columns]
        T = M + n
        mask = torch.zeros((B, T, T), dtype=torch.bool, device=device)
        mask[:, :M, :M], depth, _ = ops.build_tree(parents, max_leaves=1, max_depth=0)
        mask[:, M:, 0] = True
        mask[:, M:, M:] = block.to(device)
        base = (ctx.lengths - 1)[:, None]
        positions = torch.cat([base + depth, base + offsets.to(device)], 1)
        candidates = torch.zeros((B, T), dtype=torch.bool, device=device)
        candidates[:, :M] = True
        return Proposal(torch.cat([tokens, window], 1),
                        torch.cat([parents, torch.zeros_like(window)], 1),
                        attention_mask=mask, position_ids=positions, candidates=candidates)

    def keep_rows(self, rows: Tensor) -> None:
        self.pool.keep_rows(rows)
        self.levels = self.levels[rows]
        if self.lookup is not None:
            self.lookup.keep_rows(rows)

    def join(self, other: _LookaheadProposer) -> None:
        """Appends ``other``'s rows: their pools (their prompts' n-grams) and windows. The
        window's filled levels are the batch's: a new row's empty levels take its level-0
        tokens (guesses from its prompt, replaced as the window advances)."""
        self.pool.join(other.pool)
        levels = torch.where(other.levels < 0, other.levels[:, :1], other.levels)
        self.levels = torch.cat([self.levels, levels])
        if self.lookup is not None:
            self.lookup.join(other.lookup)

    def update(self, ctx: Context, step: StepResult) -> None:
        m = self.method
        self._advance_window(step.logits)
        if m.pool_from_prompt:  # the n-grams ending at the tokens this step committed
            self.insert_context(ctx, self.start, m.ngram)
        if not m.adaptive:
            return
        # What prompt lookup's candidates took: its estimates, and the guesses' gain beyond it.
        copied = self.lookup.accepted(ctx, step.accept_len) if self.lookup else None
        if self.shape:
            # Its candidates are the same in both shapes: a lookahead step tells exactly what
            # prompt lookup alone would have emitted.
            self.shape.emitted(step.accept_len, self.live, {1: copied} if self.shape.current == 0 else None)
        if self.guesses is not None:
            self._observe_hits(ctx, step.accept_len, copied)
        if self.lookup is not None:
            self.lookup.observe(ctx, copied)

    def _advance_window(self, logits: Tensor) -> None:
        """The new level from each run column's top level; full columns give the pool an
        n-gram and shift up."""
        w, top = self.columns, self.method.ngram - 1
        levels, columns, _, _ = _window_layout(tuple(self.fill[:w]))
        node = {(l, j): self.window_start + i for i, (l, j) in enumerate(zip(levels, columns))}
        new = logits[:, [node[self.fill[j] - 1, j] for j in range(w)]].argmax(-1)
        full = [j for j in range(w) if self.fill[j] == top]
        if full:
            column = self.levels[:, :, full]
            self.pool.insert(torch.cat([column, new[:, None, full]], 1).transpose(1, 2))
            self.levels[:, :, full] = torch.cat([column[:, 1:], new[:, None, full]], 1)
        for j in range(w):
            if self.fill[j] < top:
                self.levels[:, self.fill[j], j] = new[:, j]
                self.fill[j] += 1

    def _observe_hits(self, ctx: Context, accept_len: Tensor, copied: Tensor | None) -> None:
        """How many tokens the best of the first g guesses would have added to prompt lookup's
        (``copied [B]`` tokens of its candidates taken, None: none), per g."""
        best = matched(self.guesses, ctx, self.start, accept_len).cummax(1).values
        if copied is not None:
            best = best - copied[:, None]
        gain = best.clamp_min(0)[self.live].double()
        if gain.shape[0] == 0:
            return
        for i, mean in enumerate(gain.mean(0).tolist(), start=1):  # one host read
            self.hit[i] = 0.7 * self.hit[i] + 0.3 * mean
