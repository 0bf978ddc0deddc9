"""One `generate` call's state and its two moves: starting rows (prefill, first token, proposer)
and one verification step over the batch.

A step: the proposer returns a `Proposal` whose node 0 is the last committed token; the target
runs once over all nodes; the candidates are verified (greedy, seeded exact sampling, lossless
rejection sampling, or typical acceptance when asked for); the accepted entries of the target's
KV cache are committed; the accepted tokens and one more are emitted; the proposer gets the
step's `StepResult`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.loop.cost_model import CostModel
from specdec.loop.options import Batching
from specdec.loop.pacing import Pacing
from specdec.loop.protocol import Context, Method, Proposal, Proposer, StepResult
from specdec.loop.rows import BatchRows, Started
from specdec.loop.stats import GenerateStats
from specdec.loop.verify import Verifier
from specdec.model.cache import SpecCache
from specdec.model.forward import forward_pass, node_layout
from specdec.model.prefill import prefill_from, prefill_pass
from specdec.model.prompt_plan import PASS_TOKENS, prefill_tokens, prefix_donors, prefix_offsets, shared_prefixes

# Rows joining a batch copy the cached prompt prefix of a row already in it from this many
# common tokens on (a copy, no pass of its own: even short prefixes pay).
REUSE_MIN_TOKENS = 16


@dataclass
class Run:
    """What one call decodes with: the target, the method, the right-padded prompts of every
    row, how tokens are chosen and where they stop, and the statistics being gathered."""

    model: torch.nn.Module
    method: Method | None
    prompt: Tensor             # [B, S] right-padded
    prompt_len: Tensor         # [B]
    max_new_tokens: int
    eos: Tensor                # [E] ids that stop a row
    pad: int
    verifier: Verifier
    costs: CostModel
    batching: Batching
    profiled: bool             # pass costs were given (not measured as decoding goes)
    streamer: object | None = None
    stats: GenerateStats = dataclasses.field(default_factory=GenerateStats)

    @property
    def hidden_wanted(self) -> bool:
        return self.method is not None and (self.method.needs_hidden_states or self.method.needs_prompt_hidden_states)

    @property
    def capacity(self) -> int:
        """Committed tokens per row: prompt, output, one more step."""
        return self.prompt.shape[1] + self.max_new_tokens + 1

    def start_rows(self, ids: Tensor, batch: BatchRows | None = None, batch_cache: SpecCache | None = None) -> Started:
        """Prefills the prompts of rows ``ids``, emits their first tokens and starts their
        proposer: a batch of those rows, to join ``batch`` (whose rows' cached prompt prefixes
        they copy where theirs start alike) when given."""
        rows_start = time.perf_counter()
        k, lengths, prompt, device = ids.numel(), self.prompt_len[ids], self.prompt[ids], ids.device
        prompt_hidden = self.method is not None and self.method.needs_prompt_hidden_states
        share = self.batching.share_prefix
        donor = reused = None
        # Rows joining a batch copy no prompt prefix where every prompt token's hidden state is wanted.
        if share and batch is not None and not prompt_hidden:
            donor, reused = prefix_donors(prompt, lengths, self.prompt[batch.ids], self.prompt_len[batch.ids],
                                          REUSE_MIN_TOKENS)
            if not bool((donor >= 0).any()):
                donor = None
        shared = shared_prefixes(prompt, lengths, PASS_TOKENS) if share and k > 1 and donor is None else ()
        streams = self.verifier.streams
        ctx = Context(tokens=torch.full((k, self.capacity), self.pad, dtype=torch.long, device=device),
                      lengths=lengths.clone(), finished=torch.zeros(k, dtype=torch.bool, device=device),
                      sampling=self.verifier.sampling, streams=None if streams is None else streams.for_rows(ids),
                      costs=self.costs, shared_prefixes=shared,
                      prefix_donors=None if donor is None else (donor, reused))
        ctx.tokens[:, : prompt.shape[1]] = prompt
        self.stats.shared_prefixes += tuple(dataclasses.replace(g, rows=tuple(ids[list(g.rows)].tolist()))
                                            for g in shared)
        # Room for the output and one more step's pass; the prompts' rests after shared
        # prefixes run after each row's prefix, in passes over rows of similar lengths.
        offsets = prefix_offsets(shared, k, device)
        pass_tokens = self.method.max_pass_tokens if self.method is not None else 1
        max_length = max(self.capacity + pass_tokens, int(offsets.max()) + int((lengths - offsets).max()))
        cache = SpecCache.for_model(self.model, batch_size=k, max_length=max_length)
        if donor is None:
            logits, hidden = prefill_pass(self.model, cache, prompt, lengths, return_hidden=self.hidden_wanted,
                                          shared=shared, pass_tokens=PASS_TOKENS, all_hidden=prompt_hidden)
        else:  # prefixes copied from the batch's rows, the rests computed after them
            logits, hidden = prefill_from(self.model, cache, batch_cache, donor, reused, prompt, lengths,
                                          return_hidden=self.hidden_wanted)
            self.stats.prefix_tokens_reused += int(reused.sum())
        first = dataclasses.replace(self.verifier, streams=ctx.streams).choose(logits, lengths)
        elapsed = time.perf_counter() - rows_start
        self.stats.prefill_time_s += elapsed
        if k > 1 and device.type == "cpu" and not self.profiled and not self.costs.target_ms:
            # A batch's first point of the cost curve: the prompt's passes, as one pass over the
            # tokens they computed, shared prefixes' included (their time an upper bound: each
            # pass's own cost included), so the first steps are not sized as if every pass cost
            # the same.
            computed = prefill_tokens(lengths - offsets, PASS_TOKENS) + sum(g.length for g in shared)
            self.costs.observe_tokens(max(k, computed), elapsed * 1e3)
        self.stats.target_forwards += 1
        generated = torch.zeros(k, dtype=torch.long, device=device)
        self._emit(ctx, first[:, None], torch.ones_like(generated), generated)
        proposer = None
        if self.method is not None:
            root = torch.gather(prompt, 1, (lengths - 1)[:, None])
            zeros = torch.zeros_like(generated)
            at_last = None if hidden is None else hidden[:, None]
            if prompt_hidden:
                at_last = torch.gather(hidden, 1, (lengths - 1)[:, None, None].expand(-1, 1, hidden.shape[-1]))
            step = StepResult(Proposal.root_only(root), zeros[:, None], zeros, first, logits[:, None], at_last,
                              prompt_hidden=hidden if prompt_hidden else None)
            proposer = self.method.start(self.model, ctx, prompt, lengths, max_length, step)
        return Started(ctx, cache, proposer, generated)

    def step(self, batch: BatchRows, cache: SpecCache, proposer: Proposer | None, pacing: Pacing | None) -> None:
        """One verification step over the batch's rows: propose, one target pass, verify,
        commit, emit, update the proposer."""
        ctx, generated = batch.ctx, batch.generated
        step_start = time.perf_counter()
        if pacing is not None:  # while requests wait, the batch's total progress counts
            pacing.measure_total(batch.waiting.numel() > 0)
        budget = pacing.budget(generated, ~ctx.finished) if pacing is not None else None
        step_ctx = ctx if budget is None else dataclasses.replace(ctx, max_nodes=budget)
        proposal = proposer.propose(step_ctx) if proposer else Proposal.root_only(ctx.roots())
        # Rows that have stopped (kept with drop_finished=False) are still computed (their
        # roots) but verify nothing: their candidates would only widen the batch's pass.
        proposal = dataclasses.replace(proposal, tokens=torch.where(
            ctx.finished[:, None] & proposal.is_candidate(), -1, proposal.tokens))
        widths = None
        if cache.lengths.device.type == "cpu":  # run each row's real nodes only: a host read is free here
            proposal, widths = _trimmed(proposal)
        mask, positions = node_layout(proposal.parents, cache.lengths, proposal.attention_mask,
                                      proposal.position_ids)
        pass_start = time.perf_counter()
        logits, hidden = forward_pass(self.model, cache, proposal.tokens.clamp_min(0), proposal.parents,
                                      attention_mask=mask, position_ids=positions, return_hidden=self.hidden_wanted,
                                      widths=widths)
        if widths is not None:  # elsewhere the pass is asynchronous: use the profile
            ctx.costs.observe_tokens(int(widths.sum()), (time.perf_counter() - pass_start) * 1e3)
        self.stats.target_forwards += 1
        candidate = proposal.is_candidate()
        verified = torch.where(candidate, proposal.tokens, -1)
        verified[:, 0] = proposal.tokens[:, 0]
        path, n, nxt = self.verifier.verify(verified, proposal.parents, logits, positions, proposal.draft_probs)
        live = ~ctx.finished
        # The root's K/V was computed in this pass too: commit it with the accepted nodes.
        cache.commit_path(path, torch.where(live, n, -1))
        emitted = torch.gather(proposal.tokens, 1, path[:, 1:].clamp_min(0))
        emitted = torch.cat([emitted, torch.zeros_like(nxt)[:, None]], 1)
        emitted.scatter_(1, n[:, None], nxt[:, None])
        self.stats.proposed.append(batch.every_row_of(torch.where(live, candidate.sum(1), 0)))
        self.stats.accepted.append(batch.every_row_of(torch.where(live, n, 0)))
        self.stats.stepped.append(batch.every_row_of(live))
        self._emit(ctx, emitted, torch.where(live, n + 1, 0), generated)
        # A row that stopped within the accepted tokens (EOS, max_new_tokens) keeps only the
        # entries of what it emitted: a kept row's later passes must fit the cache.
        cache.rollback(torch.minimum(cache.lengths, ctx.lengths - 1))
        if proposer:
            proposer.update(ctx, StepResult(proposal, path, n, nxt, logits, hidden))
        if pacing is not None:
            pacing.observe(generated, ~ctx.finished, (time.perf_counter() - step_start) * 1e3)

    def _emit(self, ctx: Context, emitted: Tensor, count: Tensor, generated: Tensor) -> None:
        """Appends each row's first ``count[b]`` tokens of ``emitted`` to the committed context,
        stopping a row after EOS or at max_new_tokens."""
        B, W = emitted.shape
        columns = torch.arange(W, device=emitted.device)
        valid = columns < count[:, None]
        is_eos = torch.isin(emitted, self.eos) & valid if self.eos.numel() else torch.zeros_like(valid)
        # Tokens up to and including the first EOS.
        after_eos = (torch.cumsum(is_eos.int(), 1) - is_eos.int()) > 0
        keep = valid & ~after_eos & (columns < (self.max_new_tokens - generated)[:, None])
        n_keep = keep.sum(1)
        dst = (ctx.lengths[:, None] + columns).clamp_max(ctx.tokens.shape[1] - 1)
        ctx.tokens.scatter_(1, dst, torch.where(keep, emitted, torch.gather(ctx.tokens, 1, dst)))
        ctx.lengths += n_keep
        generated += n_keep
        ctx.finished |= (is_eos & keep).any(1) | (generated >= self.max_new_tokens)
        if self.streamer is not None:
            self.streamer.put(emitted[0, : int(n_keep[0])].cpu())


def _trimmed(proposal: Proposal) -> tuple[Proposal, Tensor]:
    """The proposal up to the batch's last real node, and each row's nodes up to its own last
    real one ``[B]`` (the widths of a packed pass: padding at the end of a row costs nothing)."""
    T = proposal.width
    widths = ((proposal.tokens >= 0) * torch.arange(T, device=proposal.tokens.device)).amax(1) + 1
    width = int(widths.max())
    return (proposal if width == T else proposal.narrowed(width)), widths
