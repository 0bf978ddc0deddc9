"""The target's own text to train on: each chunk's prompt kept, the rest written by the target.

A drafter drafts what the target is writing, so it learns best from text the target wrote
(Medusa-2's self-distillation): :func:`regenerate` keeps each chunk's prompt (a chat chunk's
request, :class:`specdec.training.corpus.Chunk` ``start``; else its first ``PROMPT_TOKENS``
tokens) and replaces the rest by the target's greedy continuation, up to the chunk's length or
the target's end-of-text token. On Qwen2.5-Coder-0.5B, Medusa heads trained on 20k tokens of
the target's answers to the default corpus's requests scored top-1 0.41 / 0.28 / 0.20 on
held-out answers of the target against 0.24 / 0.14 / 0.08 for heads trained on the
installed sources themselves (docs/benchmarks.md, "Medusa").

The continuations come from :func:`specdec.generate` in batches (one token per row a step)
and are cached next to the features, keyed by the model, the prompts and the token budget.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdec.training.corpus import MIN_CHUNK_TOKENS, Chunk
from specdec.training.features import CACHE_FOLDER, cache_key

__all__ = ["BATCH_SIZE", "PROMPT_TOKENS", "regenerate"]

PROMPT_TOKENS = 32  # the prompt of a chunk without one (plain text): its first tokens
BATCH_SIZE = 32     # rows generated together: wide passes use a CPU's cores far better than one row


def regenerate(model: nn.Module, tokenizer: Any, chunks: Sequence[Chunk], num_tokens: int, chunk_tokens: int,
               cache_root: Path, verbose: bool = True) -> tuple[list[Chunk], float | None]:
    """Chunks of the target's own text, about ``num_tokens`` tokens in all: ``chunks``' prompts
    in order, each followed by the target's greedy continuation (at most ``chunk_tokens`` tokens
    with the prompt, ending after an end-of-text token), until ``num_tokens`` are written
    (``chunks`` must hold enough prompts: continuations stop early). Continuations with fewer
    than ``MIN_CHUNK_TOKENS`` tokens are left out. Returns them and the seconds the generation
    took (None: read from the cache under ``cache_root``).

    Example (a tiny random model; its greedy continuations follow its first ``PROMPT_TOKENS``
    tokens):
        >>> import tempfile
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> target = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...                                       num_hidden_layers=1, num_attention_heads=2)).eval()
        >>> target.generation_config.eos_token_id = None  # no end-of-text token: chunks run full
        >>> text = [Chunk(tuple(range(1, 64))), Chunk(tuple(range(5, 64)))]
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     own, seconds = regenerate(target, None, text, num_tokens=150, chunk_tokens=80,
        ...                               cache_root=Path(tmp), verbose=False)
        >>> [(len(c.ids), c.start, c.ids[:3]) for c in own]  # the second cut at num_tokens
        [(80, 32, (1, 2, 3)), (70, 32, (5, 6, 7))]
    """
    prompts = [_prompt(c) for c in chunks]
    key, stem = cache_key(model, prompts, num_tokens, chunk_tokens)
    path = cache_root / CACHE_FOLDER / f"{stem}-regenerated-{key[:20]}.json"
    if path.is_file():
        if verbose:
            print(f"[regenerate] from the cache: {path}", flush=True)
        return [Chunk(tuple(ids), start) for ids, start in json.loads(path.read_text())], None

    from tqdm.auto import tqdm

    from specdec.loop.generate import generate

    eos = model.generation_config.eos_token_id if getattr(model, "generation_config", None) else None
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    device = next(model.parameters()).device
    out: list[Chunk] = []
    total = 0
    start = time.perf_counter()
    def done(prompt: Chunk) -> bool:  # no room left for a useful chunk after this prompt
        return num_tokens - total - prompt.start < MIN_CHUNK_TOKENS

    at = 0
    with tqdm(total=num_tokens, unit="tok", desc="regenerate", disable=not verbose, file=sys.stderr) as bar:
        while at < len(prompts) and not done(prompts[at]):
            rows = min(BATCH_SIZE, -(-(num_tokens - total) // chunk_tokens))  # no more than the budget needs
            batch, at = prompts[at: at + rows], at + rows
            width = max(len(p.ids) for p in batch)
            ids = torch.zeros((len(batch), width), dtype=torch.long, device=device)
            mask = torch.zeros_like(ids)
            for r, p in enumerate(batch):  # left-padded
                ids[r, width - len(p.ids):] = torch.tensor(p.ids)
                mask[r, width - len(p.ids):] = 1
            result = generate(model, ids, max_new_tokens=chunk_tokens - min(len(p.ids) for p in batch),
                              attention_mask=mask, eos_token_id=eos, pad_token_id=0)
            counts = result.stats.new_tokens_per_row.tolist()
            for r, p in enumerate(batch):
                if done(p):
                    break
                written = result.sequences[r, width: width + counts[r]].tolist()
                chunk = Chunk(tuple((list(p.ids) + written)[: min(chunk_tokens, num_tokens - total)]), p.start)
                if len(chunk.ids) - chunk.start >= MIN_CHUNK_TOKENS:
                    out.append(chunk)
                    total += len(chunk.ids)
                    bar.update(len(chunk.ids))
    elapsed = time.perf_counter() - start
    if len(out) < 2:
        raise ValueError(f"regenerate: the target wrote {len(out)} continuation(s) of at least {MIN_CHUNK_TOKENS} "
                         f"tokens from {len(prompts)} prompts; a training and a held-out chunk are needed")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps([[list(c.ids), c.start] for c in out]))
    os.replace(tmp, path)
    if verbose:
        print(f"[regenerate] {total} tokens of the target's own text in {elapsed:.0f} s "
              f"({total / elapsed:.0f} tok/s), cached in {path}", flush=True)
    return out, elapsed


def _prompt(chunk: Chunk) -> Chunk:
    """The chunk's prompt: a chat chunk's request, else its first ``PROMPT_TOKENS`` tokens."""
    start = chunk.start or min(PROMPT_TOKENS, len(chunk.ids) - 1)
    return Chunk(chunk.ids[:start], start)
