"""The verify loop shared by every decoder: `generate`.

Each step the method's proposer proposes candidates, the target runs once over them, the ops
verify them, the KV cache keeps the accepted entries and the accepted tokens and one more are
emitted (`specdec.loop.run.Run.step`). A method is only its proposer.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from torch import Tensor

from specdec.loop.cost_model import CostModel
from specdec.loop.options import Batching
from specdec.loop.pacing import Pacing
from specdec.loop.protocol import Method
from specdec.loop.random_streams import RandomStreams
from specdec.loop.rows import BatchRows
from specdec.loop.run import Run
from specdec.loop.sampling import Sampling
from specdec.loop.stats import GenerateOutput
from specdec.loop.verify import Verifier
from specdec.model.attention import tree_attention_enabled
from specdec.ops import TypicalAcceptance

__all__ = ["Batching", "GenerateOutput", "generate", "left_align"]


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
    *,
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
    batching: Batching | None = None,
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
        batching: how a batch's rows are served (`Batching`: ``max_batch_size`` for a queue
            of requests, ``drop_finished``, ``share_prefix``, ``pace``); default ``Batching()``.

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
        >>> served = generate(model, queue, max_new_tokens=8, method=PromptLookup(),
        ...                   batching=Batching(max_batch_size=2))
        >>> torch.equal(served.sequences, generate(model, queue, max_new_tokens=8).sequences)
        True
    """
    start = time.perf_counter()
    batching = batching or Batching()
    _check_inputs(input_ids, attention_mask, max_new_tokens, streamer)
    B, device = input_ids.shape[0], input_ids.device
    prompt, prompt_len = left_align(input_ids, attention_mask)
    if int(prompt_len.min()) < 1:
        raise ValueError("every row needs at least one prompt token")
    rows_at_once = min(B, batching.max_batch_size or B)
    sampling = Sampling(do_sample, temperature, top_k, top_p)
    eos = _eos_ids(model, eos_token_id, device)
    run = Run(model, method, _right_padded(prompt, prompt_len), prompt_len, max_new_tokens, eos,
              _pad_id(model, pad_token_id, eos),
              Verifier(sampling, RandomStreams.from_generator(generator) if do_sample else None, typical),
              CostModel(dict(pass_costs or {}), rows=rows_at_once, packed=device.type == "cpu"),
              batching, profiled=bool(pass_costs), streamer=streamer)
    if streamer is not None:
        streamer.put(input_ids.cpu())
    with torch.inference_mode(), tree_attention_enabled(model, *(method.models if method else ())):
        ids = torch.arange(B, device=device)
        first = run.start_rows(ids[:rows_at_once])
        proposer = first.proposer
        _check_batching(batching, method, proposer, rows_at_once < B)
        run.verifier = dataclasses.replace(run.verifier, streams=first.ctx.streams)  # the batch's rows' numbers
        pacing = Pacing() if batching.pace and proposer is not None and rows_at_once > 1 else None
        drop = batching.drop_finished and (proposer is None or proposer.drops_rows)
        batch = BatchRows(first.ctx, first.generated, B, ids[rows_at_once:], drop)
        while batch.going(first.cache, proposer, rows_at_once):
            if batch.free:
                joining = batch.waiting[: batch.free]
                batch.join(run.start_rows(joining, batch, first.cache), joining, first.cache, proposer)
                if not bool((~batch.ctx.finished).any()):  # they stopped at their first token
                    continue
            run.step(batch, first.cache, proposer, pacing)
        tokens, generated = batch.every_row()
    if streamer is not None:
        streamer.end()
    stats = run.stats
    stats.new_tokens, stats.new_tokens_per_row = int(generated.sum()), generated
    stats.wall_time_s = time.perf_counter() - start
    columns = torch.arange(max_new_tokens, device=device)
    src = (prompt_len[:, None] + columns).clamp_max(tokens.shape[1] - 1)
    new = torch.where(columns < generated[:, None], torch.gather(tokens, 1, src), run.pad).to(input_ids.dtype)
    return GenerateOutput(torch.cat([input_ids, new], 1), stats)


def _check_inputs(input_ids: Tensor, attention_mask: Tensor | None, max_new_tokens: int, streamer) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}, "
                         f"got {tuple(attention_mask.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError("a streamer needs batch size 1")


def _check_batching(batching: Batching, method: Method | None, proposer, queued: bool) -> None:
    """A queue (rows waiting) needs rows to leave the batch and a proposer that takes rows."""
    if not queued:
        return
    if not batching.drop_finished:
        raise ValueError(f"max_batch_size={batching.max_batch_size} needs rows to leave the batch: "
                         "drop_finished=True")
    if proposer is not None and not (proposer.drops_rows and proposer.joins_rows):
        raise ValueError(f"max_batch_size={batching.max_batch_size} needs a method whose proposers let rows "
                         f"leave and join the batch ({type(method).__name__}'s do not)")


def _right_padded(tokens: Tensor, lengths: Tensor) -> Tensor:
    # Padding ids may be outside the vocabulary (-1): the model reads them, so use token 0.
    columns = torch.arange(tokens.shape[1], device=tokens.device)
    return torch.where(columns < lengths[:, None], tokens, 0)


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
