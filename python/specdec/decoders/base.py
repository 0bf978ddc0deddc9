"""The verify loop shared by every decoder.

A step: the method's proposer returns a `Proposal` whose node 0 is the last committed token
(a tree of candidates, or any attention pattern with nodes that are computed but not
verified); the target runs once over all nodes; the candidates are verified (greedy, seeded
exact sampling, lossless rejection sampling, or typical acceptance when asked for); the
accepted entries of the target's KV cache are committed; the accepted tokens and one more are
emitted; the proposer gets the step's `StepResult` (logits, and hidden states when it asks).
A method is only its proposer.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from torch import Tensor

from specdec.cache import SpecCache
from specdec.cost_model import CostModel
from specdec.decoders.pacing import Pacing
from specdec.decoders.protocol import Context, Method, Proposal, Proposer, StepResult
from specdec.decoders.rows import BatchRows
from specdec.decoders.stats import GenerateOutput, GenerateStats
from specdec.decoders.verify import Verifier
from specdec.ops import TypicalAcceptance
from specdec.random_streams import RandomStreams
from specdec.sampling import Sampling
from specdec.tree_forward import (PASS_TOKENS, node_layout, prefill, prefill_from, prefill_tokens, prefix_donors,
                                  prefix_offsets, shared_prefixes, tree_attention_enabled, tree_forward)

# Rows joining a batch copy the cached prompt prefix of a row already in it from this many
# common tokens on (a copy, no pass of its own: even short prefixes pay).
REUSE_MIN_TOKENS = 16

__all__ = ["Context", "GenerateOutput", "GenerateStats", "Method", "Proposal", "Proposer",
           "StepResult", "generate", "left_align"]


def left_align(input_ids: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Each row's prompt tokens moved to the front (any padding side), and the prompt lengths.
    What follows a row's prompt is padding (prefill ignores it)."""
    if attention_mask is None:
        lengths = torch.full((input_ids.shape[0],), input_ids.shape[1], device=input_ids.device)
        return input_ids, lengths
    mask = attention_mask.bool()
    lengths = mask.sum(1)
    # Stable sort puts the kept positions first, in order.
    order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices
    return torch.gather(input_ids, 1, order), lengths


def generate(
    model: torch.nn.Module,
    input_ids: Tensor,
    max_new_tokens: int = 128,
    method: Method | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    attention_mask: Tensor | None = None,
    streamer=None,
    generator: torch.Generator | None = None,
    pass_costs: dict[int, float] | None = None,
    typical: TypicalAcceptance | None = None,
    pace: bool = True,
    share_prefix: bool = True,
    drop_finished: bool = True,
    max_batch_size: int | None = None,
) -> GenerateOutput:
    """Generates with speculative decoding; the output is the target's own.

    Greedy (``do_sample=False``) output is identical to ``model.generate(do_sample=False)``.
    Sampled output follows the target's distribution under temperature/top-k/top-p exactly.
    The random numbers come from ``generator`` (one draw fixes the run) and are indexed by row
    and position, not drawn per step: with deterministic candidates (prompt lookup, coupled
    drafts) a seeded run emits exactly the tokens that ``method=None`` emits with the same
    seed, whatever the method and its proposal sizes. ``method=None`` decodes one token per
    target pass.

    Args:
        model: a Hugging Face causal LM (the target).
        input_ids: ``[B, S]`` prompts; with ``attention_mask`` (``[B, S]``) rows may be left- or
            right-padded.
        method: ``specdec.DraftModel(...)``, ``specdec.PromptLookup(...)``, or None.
        eos_token_id: a row stops after emitting one of these (default: the model's).
        pad_token_id: fills each row after it stops (default: the model's, else EOS, else 0).
        streamer: a `transformers` streamer (``put``/``end``); batch size 1 only.
        generator: a ``torch.Generator`` that seeds sampling (default: torch's global one).
        pass_costs: ms per target pass over k tokens (``specdec.profile_passes``: one row),
            used by adaptive methods; a batch's pass of B rows x k nodes is priced as B k tokens.
        typical: ``specdec.TypicalAcceptance(...)``: Medusa's typical acceptance, LOSSY (the
            output no longer follows the target's distribution exactly; more candidates are
            accepted). Sampling only, deterministic candidates only. Default: exact.
        pace: batches (more than one row at once) only: while steps without candidates
            advance the batch's slowest row (while requests wait: all its rows) faster per ms
            than the method's steps (measured as decoding goes), decode one token per pass
            (`specdec.decoders.pacing`). False: the method proposes every step.
        share_prefix: batches only: leading prompt tokens that several rows have in common (a
            system prompt, few-shot examples; any groups of rows, `shared_prefixes`) are
            computed once by the target and by each draft model and copied into their rows, for
            each group that spares more than ``PASS_TOKENS`` (64) tokens of prefill ((rows -
            1) x the common length); ``stats.shared_prefixes`` lists them. False: every row
            computes its whole prompt.
        drop_finished: batches only: a row that has stopped (EOS, ``max_new_tokens``) leaves the
            batch after the step it stopped in (its cache entries and its proposer state
            dropped), so later passes run only the rows still going. False: stopped rows stay
            in every pass (as in HF's batched ``generate``), computing their root.
        max_batch_size: at most this many rows decode at once (default: every row). The other
            rows wait, in order, and take the places of rows that stop (continuous batching:
            a queue of requests served ``max_batch_size`` at a time, each row's output the
            same as decoding it alone). Rows that start together share their prompt prefixes
            (``share_prefix``); seeded sampling gives each row the same tokens however the
            rows are batched. Needs ``drop_finished`` and a method whose proposers take rows
            mid-run (every built-in one).

    Returns:
        ``GenerateOutput(sequences, stats)``: ``sequences [B, S + max_new_tokens]`` is the input
        as given followed by each row's new tokens, padded after the row stops.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> _ = torch.manual_seed(0)
        >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_attention_heads=4,
        ...     num_key_value_heads=2, num_hidden_layers=2, intermediate_size=64, vocab_size=50)).eval()
        >>> ids = torch.tensor([[1, 7, 8, 9, 7, 8]])
        >>> from specdec import PromptLookup
        >>> out = generate(model, ids, max_new_tokens=8, method=PromptLookup())
        >>> plain = model.generate(ids, max_new_tokens=8, do_sample=False)
        >>> torch.equal(out.sequences[:, : plain.shape[1]], plain)  # HF stops at EOS; we pad after it
        True

        A queue of five requests served two rows at a time: each row's output is its own.
        >>> queue = torch.randint(3, 50, (5, 6), generator=torch.Generator().manual_seed(1))
        >>> served = generate(model, queue, max_new_tokens=8, method=PromptLookup(), max_batch_size=2)
        >>> torch.equal(served.sequences, generate(model, queue, max_new_tokens=8).sequences)
        True
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}, "
                         f"got {tuple(attention_mask.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError("a streamer needs batch size 1")
    if max_batch_size is not None and max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    sampling = Sampling(do_sample, temperature, top_k, top_p)
    streams = RandomStreams.from_generator(generator) if do_sample else None
    verifier = Verifier(sampling, streams, typical)
    eos = _eos_ids(model, eos_token_id, input_ids.device)
    pad = _pad_id(model, pad_token_id, eos)
    start = time.perf_counter()
    device, (B, S) = input_ids.device, input_ids.shape
    prompt, prompt_len = left_align(input_ids, attention_mask)
    prompt = _right_padded(prompt, prompt_len)
    if int(prompt_len.min()) < 1:
        raise ValueError("every row needs at least one prompt token")

    capacity = S + max_new_tokens + 1  # committed tokens per row: prompt, output, one more step
    rows_at_once = B if max_batch_size is None else max_batch_size
    costs = CostModel(dict(pass_costs or {}), rows=min(B, rows_at_once), packed=device.type == "cpu")
    models = (model, *(method.models if method is not None else ()))
    hidden_wanted = method is not None and method.needs_hidden_states
    stats = GenerateStats()
    if streamer is not None:
        streamer.put(input_ids.cpu())
    with torch.inference_mode(), tree_attention_enabled(*models):
        def start_rows(ids: Tensor, batch: BatchRows | None = None,
                       batch_cache: SpecCache | None = None) -> tuple[Context, SpecCache, Proposer | None, Tensor]:
            """Prefills the prompts of rows ``ids``, emits their first tokens and starts their
            proposer: a batch of those rows, to join ``batch`` (whose rows' cached prompt
            prefixes they copy where theirs start alike) when given."""
            rows_start = time.perf_counter()
            k, lengths = ids.numel(), prompt_len[ids]
            rows_prompt = prompt[ids]
            donor = reused = None
            if share_prefix and batch is not None:
                donor, reused = prefix_donors(rows_prompt, lengths, prompt[batch.ids], prompt_len[batch.ids],
                                              REUSE_MIN_TOKENS)
                if not bool((donor >= 0).any()):
                    donor = None
            shared = (shared_prefixes(rows_prompt, lengths, PASS_TOKENS) if share_prefix and k > 1 and donor is None
                      else ())
            ctx = Context(tokens=torch.full((k, capacity), pad, dtype=torch.long, device=device),
                          lengths=lengths.clone(), finished=torch.zeros(k, dtype=torch.bool, device=device),
                          sampling=sampling, streams=None if streams is None else streams.for_rows(ids),
                          costs=costs, shared_prefixes=shared,
                          prefix_donors=None if donor is None else (donor, reused))
            ctx.tokens[:, :S] = rows_prompt
            stats.shared_prefixes += tuple(dataclasses.replace(g, rows=tuple(ids[list(g.rows)].tolist()))
                                           for g in shared)
            # Room for the output and one more step's pass; the prompts' rests after shared
            # prefixes run after each row's prefix, in passes over rows of similar lengths.
            offsets = prefix_offsets(shared, k, device)
            max_length = max(S + max_new_tokens + 1 + (method.max_pass_tokens if method is not None else 1),
                             int(offsets.max()) + int((lengths - offsets).max()))
            cache = SpecCache.for_model(model, batch_size=k, max_length=max_length)
            if donor is None:
                out = prefill(model, cache, rows_prompt, lengths, return_hidden=hidden_wanted, shared=shared,
                              pass_tokens=PASS_TOKENS)
            else:  # prefixes copied from the batch's rows, the rests computed after them
                out = prefill_from(model, cache, batch_cache, donor, reused, rows_prompt, lengths,
                                   return_hidden=hidden_wanted)
                stats.prefix_tokens_reused += int(reused.sum())
            logits, hidden = out if hidden_wanted else (out, None)
            first = dataclasses.replace(verifier, streams=ctx.streams).choose(logits, lengths)
            elapsed = time.perf_counter() - rows_start
            stats.prefill_time_s += elapsed
            if k > 1 and device.type == "cpu" and not pass_costs and not costs.target_ms:
                # A batch's first point of the cost curve: the prompt's passes, as one pass over the
                # tokens they computed, shared prefixes' included (their time an upper bound: each
                # pass's own cost included), so the first steps are not sized as if every pass cost
                # the same.
                computed = prefill_tokens(lengths - offsets, PASS_TOKENS) + sum(g.length for g in shared)
                costs.observe_tokens(max(k, computed), elapsed * 1e3)
            stats.target_forwards += 1
            generated = torch.zeros(k, dtype=torch.long, device=device)
            _emit(ctx, first[:, None], torch.ones_like(generated), generated, max_new_tokens, eos, streamer)
            proposer = None
            if method is not None:
                root = torch.gather(rows_prompt, 1, (lengths - 1)[:, None])
                zeros = torch.zeros_like(generated)
                step = StepResult(Proposal.root_only(root), zeros[:, None], zeros, first,
                                  logits[:, None], None if hidden is None else hidden[:, None])
                proposer = method.start(model, ctx, rows_prompt, lengths, max_length, step)
            return ctx, cache, proposer, generated

        ids = torch.arange(B, device=device)
        ctx, cache, proposer, generated = start_rows(ids[:rows_at_once])
        can_drop = proposer is None or (hasattr(proposer, "keep_rows") and getattr(proposer, "drops_rows", True))
        if rows_at_once < B and not drop_finished:
            raise ValueError(f"max_batch_size={max_batch_size} needs rows to leave the batch: drop_finished=True")
        if rows_at_once < B and not (can_drop and (
                proposer is None or (hasattr(proposer, "join") and getattr(proposer, "joins_rows", True)))):
            raise ValueError(f"max_batch_size={max_batch_size} needs a method whose proposers let rows leave and "
                             f"join the batch ({type(method).__name__}'s do not)")
        verifier = dataclasses.replace(verifier, streams=ctx.streams)  # the batch's rows' numbers
        pacing = Pacing() if pace and proposer is not None and min(B, rows_at_once) > 1 else None
        batch = BatchRows(ctx, generated, B, ids[rows_at_once:], drop_finished and can_drop)
        while batch.going(cache, proposer, rows_at_once):
            if batch.free:
                joining = batch.waiting[: batch.free]
                batch.join(start_rows(joining, batch, cache), joining, cache, proposer)
                if not bool((~batch.ctx.finished).any()):  # they stopped at their first token
                    continue
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
            if device.type == "cpu":  # run each row's real nodes only: a host read is free here
                proposal, widths = _trimmed(proposal)
            mask, positions = node_layout(proposal.parents, cache.lengths, proposal.attention_mask,
                                          proposal.position_ids)
            pass_start = time.perf_counter()
            out = tree_forward(model, cache, proposal.tokens.clamp_min(0), proposal.parents,
                               attention_mask=mask, position_ids=positions, return_hidden=hidden_wanted,
                               widths=widths)
            logits, hidden = out if hidden_wanted else (out, None)
            if widths is not None:  # elsewhere the pass is asynchronous: use the profile
                ctx.costs.observe_tokens(int(widths.sum()), (time.perf_counter() - pass_start) * 1e3)
            stats.target_forwards += 1
            candidate = proposal.is_candidate()
            verified = torch.where(candidate, proposal.tokens, -1)
            verified[:, 0] = proposal.tokens[:, 0]
            path, n, nxt = verifier.verify(verified, proposal.parents, logits, positions,
                                           proposal.draft_probs)
            live = ~ctx.finished
            # The root's K/V was computed in this pass too: commit it with the accepted nodes.
            cache.commit_path(path, torch.where(live, n, -1))
            emitted = torch.gather(proposal.tokens, 1, path[:, 1:].clamp_min(0))
            emitted = torch.cat([emitted, torch.zeros_like(nxt)[:, None]], 1)
            emitted.scatter_(1, n[:, None], nxt[:, None])
            stats.proposed.append(batch.every_row_of(torch.where(live, candidate.sum(1), 0)))
            stats.accepted.append(batch.every_row_of(torch.where(live, n, 0)))
            _emit(ctx, emitted, torch.where(live, n + 1, 0), generated, max_new_tokens, eos, streamer)
            # A row that stopped within the accepted tokens (EOS, max_new_tokens) keeps only the
            # entries of what it emitted: a kept row's later passes must fit the cache.
            cache.rollback(torch.minimum(cache.lengths, ctx.lengths - 1))
            if proposer:
                proposer.update(ctx, StepResult(proposal, path, n, nxt, logits, hidden))
            if pacing is not None:
                pacing.observe(generated, ~ctx.finished, (time.perf_counter() - step_start) * 1e3)
        tokens, generated = batch.every_row()
    if streamer is not None:
        streamer.end()
    stats.new_tokens = int(generated.sum())
    stats.new_tokens_per_row = generated
    stats.wall_time_s = time.perf_counter() - start
    new = torch.full((B, max_new_tokens), pad, dtype=input_ids.dtype, device=device)
    columns = torch.arange(max_new_tokens, device=device)
    src = (prompt_len[:, None] + columns).clamp_max(capacity - 1)
    keep = columns < generated[:, None]
    new = torch.where(keep, torch.gather(tokens, 1, src), new)
    return GenerateOutput(torch.cat([input_ids, new], 1), stats)


def _trimmed(proposal: Proposal) -> tuple[Proposal, Tensor]:
    """The proposal up to the batch's last real node, and each row's nodes up to its own last
    real one ``[B]`` (the widths of a packed pass: padding at the end of a row costs nothing)."""
    T = proposal.width
    widths = ((proposal.tokens >= 0) * torch.arange(T, device=proposal.tokens.device)).amax(1) + 1
    width = int(widths.max())
    return (proposal if width == T else proposal.narrowed(width)), widths


def _right_padded(tokens: Tensor, lengths: Tensor) -> Tensor:
    # Padding ids may be outside the vocabulary (-1): the model reads them, so use token 0.
    columns = torch.arange(tokens.shape[1], device=tokens.device)
    return torch.where(columns < lengths[:, None], tokens, 0)


def _emit(ctx: Context, emitted: Tensor, count: Tensor, generated: Tensor, max_new_tokens: int,
          eos: Tensor, streamer) -> None:
    """Appends each row's first ``count[b]`` tokens of ``emitted`` to the committed context,
    stopping a row after EOS or at max_new_tokens."""
    B, W = emitted.shape
    columns = torch.arange(W, device=emitted.device)
    valid = columns < count[:, None]
    is_eos = torch.isin(emitted, eos) & valid if eos.numel() else torch.zeros_like(valid)
    # Tokens up to and including the first EOS.
    after_eos = (torch.cumsum(is_eos.int(), 1) - is_eos.int()) > 0
    keep = valid & ~after_eos & (columns < (max_new_tokens - generated)[:, None])
    n_keep = keep.sum(1)
    dst = (ctx.lengths[:, None] + columns).clamp_max(ctx.tokens.shape[1] - 1)
    ctx.tokens.scatter_(1, dst, torch.where(keep, emitted, torch.gather(ctx.tokens, 1, dst)))
    ctx.lengths += n_keep
    generated += n_keep
    ctx.finished |= (is_eos & keep).any(1) | (generated >= max_new_tokens)
    if streamer is not None:
        streamer.put(emitted[0, : int(n_keep[0])].cpu())


def _model_setting(model: torch.nn.Module, name: str):
    config = getattr(model, "generation_config", None) or model.config
    return getattr(config, name, None)


def _eos_ids(model: torch.nn.Module, eos_token_id, device) -> Tensor:
    if eos_token_id is None:
        eos_token_id = _model_setting(model, "eos_token_id")
    if eos_token_id is None:
        eos_token_id = []
    if isinstance(eos_token_id, int):
        eos_token_id = [eos_token_id]
    return torch.tensor(list(eos_token_id), dtype=torch.long, device=device)


def _pad_id(model: torch.nn.Module, pad_token_id, eos: Tensor) -> int:
    if pad_token_id is None:
        pad_token_id = _model_setting(model, "pad_token_id")
    if pad_token_id is None:
        pad_token_id = int(eos[0]) if eos.numel() else 0
    return int(pad_token_id)
