"""The verify loop shared by every decoder.

A step: the method's proposer puts candidate tokens in a tree whose root (node 0) is the last
committed token; the target runs once over the whole tree with tree attention; the ops verify
(greedy, or lossless speculative sampling); the accepted entries of the target's KV cache are
committed; the accepted tokens and one more are emitted. A method is only its proposer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from specdec import ops
from specdec.cache import SpecCache
from specdec.cost_model import CostModel
from specdec.sampling import Sampling
from specdec.tree_forward import prefill, tree_attention_enabled, tree_forward


@dataclass
class Proposal:
    """Candidates of one step. ``tokens[:, 0]`` is the root (the last committed token); -1 marks a
    padding node (never accepted). ``draft_probs[:, c]`` is the distribution node c was drawn
    from (None: deterministic candidates)."""

    tokens: Tensor                   # [B, T]
    parents: Tensor                  # [B, T]
    draft_probs: Tensor | None = None  # [B, T, V]


@dataclass
class Context:
    """What a proposer may read: the committed tokens of every row (prompt, then output; the last
    one is the root of the next tree) and how tokens are chosen."""

    tokens: Tensor            # [B, capacity] committed tokens, left-aligned
    lengths: Tensor           # [B] committed tokens per row
    finished: Tensor          # [B] bool
    sampling: Sampling
    generator: torch.Generator | None
    costs: CostModel  # target pass costs: profiled, and measured as decoding goes (CPU)


class Proposer(Protocol):
    def propose(self, ctx: Context) -> Proposal: ...

    def update(self, ctx: Context, proposal: Proposal, accept_len: Tensor) -> None:
        """Called after each step with the committed context already advanced."""


class Method(Protocol):
    """A speculative decoding method: how to build its proposer for one `generate` call."""

    @property
    def max_candidates(self) -> int:
        """Most tree nodes a proposal may have (root included)."""

    @property
    def models(self) -> tuple[torch.nn.Module, ...]:
        """Models the method runs besides the target (they get tree attention too)."""

    def start(self, target: torch.nn.Module, ctx: Context, prompt: Tensor, prompt_len: Tensor,
              max_length: int) -> Proposer: ...


@dataclass
class GenerateStats:
    """Per-step and total statistics of one `generate` call."""

    proposed: list[Tensor] = field(default_factory=list)  # per step: [B] candidates proposed
    accepted: list[Tensor] = field(default_factory=list)  # per step: [B] candidates accepted
    target_forwards: int = 0     # target passes, the prefill included
    new_tokens: int = 0          # tokens generated, all rows
    wall_time_s: float = 0.0

    @property
    def total_proposed(self) -> int:
        return int(sum(int(p.sum()) for p in self.proposed))

    @property
    def total_accepted(self) -> int:
        return int(sum(int(a.sum()) for a in self.accepted))

    @property
    def acceptance_rate(self) -> float:
        """Accepted candidates / proposed candidates."""
        return self.total_accepted / max(1, self.total_proposed)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per row per verification step (accepted + the one more), averaged."""
        steps = sum(int(a.numel()) for a in self.accepted)
        return (self.total_accepted + steps) / max(1, steps)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0


@dataclass
class GenerateOutput:
    sequences: Tensor  # [B, S + new]: the input as given, then new tokens, pad after a row ends
    stats: GenerateStats


def choose(logits: Tensor, sampling: Sampling, generator: torch.Generator | None) -> Tensor:
    """The next token from the target's logits [..., V]: argmax, or a sample."""
    if not sampling.do_sample:
        return logits.argmax(-1)
    probs = sampling.probs(logits)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


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
) -> GenerateOutput:
    """Generates with speculative decoding; the output is the target's own.

    Greedy (``do_sample=False``) output is identical to ``model.generate(do_sample=False)``;
    sampled output follows the target's distribution under temperature/top-k/top-p exactly
    (reproducible with ``generator``). ``method=None`` decodes one token per target pass.

    Args:
        model: a Hugging Face causal LM (the target).
        input_ids: ``[B, S]`` prompts; with ``attention_mask`` rows may be left- or right-padded.
        method: ``specdec.DraftModel(...)``, ``specdec.PromptLookup(...)``, or None.
        eos_token_id: a row stops after emitting one of these (default: the model's).
        pad_token_id: fills each row after it stops (default: the model's, else EOS, else 0).
        streamer: a `transformers` streamer (``put``/``end``); batch size 1 only.
        pass_costs: ms per target pass over k tokens (``specdec.profile_passes``), used by
            adaptive methods.

    Returns:
        ``GenerateOutput(sequences, stats)``: ``sequences [B, S + max_new_tokens]`` is the input
        as given followed by each row's new tokens, padded after the row stops.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError("a streamer needs batch size 1")
    sampling = Sampling(do_sample, temperature, top_k, top_p)
    eos = _eos_ids(model, eos_token_id, input_ids.device)
    pad = _pad_id(model, pad_token_id, eos)
    start = time.perf_counter()
    device, (B, S) = input_ids.device, input_ids.shape
    prompt, prompt_len = left_align(input_ids, attention_mask)
    prompt = _right_padded(prompt, prompt_len)
    if int(prompt_len.min()) < 1:
        raise ValueError("every row needs at least one prompt token")

    # Committed tokens of every row: prompt, then output; room for one more tree per row.
    capacity = S + max_new_tokens + 1
    ctx = Context(
        tokens=torch.full((B, capacity), pad, dtype=torch.long, device=device),
        lengths=prompt_len.clone(),
        finished=torch.zeros(B, dtype=torch.bool, device=device),
        sampling=sampling,
        generator=generator,
        costs=CostModel(dict(pass_costs or {})),
    )
    ctx.tokens[:, :S] = prompt
    stats = GenerateStats()
    if streamer is not None:
        streamer.put(input_ids.cpu())

    max_length = S + max_new_tokens + 1 + (method.max_candidates if method is not None else 1)
    models = (model, *(method.models if method is not None else ()))
    with torch.inference_mode(), tree_attention_enabled(*models):
        cache = SpecCache.for_model(model, batch_size=B, max_length=max_length)
        first = choose(prefill(model, cache, prompt, prompt_len), sampling, generator)
        stats.target_forwards += 1
        generated = torch.zeros(B, dtype=torch.long, device=device)
        _emit(ctx, first[:, None], torch.ones_like(generated), generated, max_new_tokens, eos, streamer)
        proposer = method.start(model, ctx, prompt, prompt_len, max_length) if method else None
        while not bool(ctx.finished.all()):
            proposal = proposer.propose(ctx) if proposer else _root_only(ctx)
            tokens, parents = proposal.tokens, proposal.parents
            pass_start = time.perf_counter()
            logits = tree_forward(model, cache, tokens.clamp_min(0), parents)
            if device.type == "cpu":  # elsewhere the pass is asynchronous: use the profile
                ctx.costs.observe_target(tokens.shape[1], (time.perf_counter() - pass_start) * 1e3)
            stats.target_forwards += 1
            if sampling.do_sample:
                uniform = torch.rand(tokens.shape, generator=generator, device=device)
                path, n, nxt = ops.tree_speculative_sampling(
                    tokens, parents, sampling.probs(logits), uniform, proposal.draft_probs)
            else:
                path, n, nxt = ops.tree_verify_greedy(tokens, parents, logits)
            live = ~ctx.finished
            # The root's K/V was computed in this pass too: commit it with the accepted nodes.
            cache.commit_path(path, torch.where(live, n, -1))
            emitted = torch.gather(tokens, 1, path[:, 1:].clamp_min(0))
            emitted = torch.cat([emitted, torch.zeros_like(nxt)[:, None]], 1)
            emitted.scatter_(1, n[:, None], nxt[:, None])
            stats.proposed.append(torch.where(live, (tokens[:, 1:] >= 0).sum(1), 0))
            stats.accepted.append(torch.where(live, n, 0))
            _emit(ctx, emitted, torch.where(live, n + 1, 0), generated, max_new_tokens, eos, streamer)
            if proposer:
                proposer.update(ctx, proposal, n)
    if streamer is not None:
        streamer.end()
    stats.new_tokens = int(generated.sum())
    stats.wall_time_s = time.perf_counter() - start
    new = torch.full((B, max_new_tokens), pad, dtype=input_ids.dtype, device=device)
    columns = torch.arange(max_new_tokens, device=device)
    src = (prompt_len[:, None] + columns).clamp_max(capacity - 1)
    keep = columns < generated[:, None]
    new = torch.where(keep, torch.gather(ctx.tokens, 1, src), new)
    return GenerateOutput(torch.cat([input_ids, new], 1), stats)


def _right_padded(tokens: Tensor, lengths: Tensor) -> Tensor:
    # Padding ids may be outside the vocabulary (-1): the model reads them, so use token 0.
    columns = torch.arange(tokens.shape[1], device=tokens.device)
    return torch.where(columns < lengths[:, None], tokens, 0)


def _root_only(ctx: Context) -> Proposal:
    root = torch.gather(ctx.tokens, 1, (ctx.lengths - 1)[:, None])
    return Proposal(root, torch.full_like(root, -1))


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
