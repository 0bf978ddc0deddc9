"""What a drafter learns from: the target's final hidden states and greedy tokens over chunks
of text, cached per model and chunks.

One teacher-forced forward of the target over each chunk gives both what a drafter reads and
what it learns: the final hidden states ``h_t`` (``model.get_decoder()``'s output) and the
target's greedy prediction ``g_t = argmax lm_head(h_t)`` (its token for position t + 1), so the
drafter imitates what the target will emit, not what the text says. That forward is most of a
training's cost, so features (float16) and labels (int32) are cached under
``<specdec cache>/medusa-features/``, keyed by the model (name, dtype, sizes, a fingerprint of
its embeddings) and the chunks' token ids: a rerun costs no forward.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from specdec.training.corpus import Chunk

__all__ = ["CACHE_FOLDER", "Features", "cache_key", "commonest_ids", "extract_features", "head_targets"]

# Under the specdec cache; the name predates other drafters and is kept so that existing caches
# are found.
CACHE_FOLDER = "medusa-features"


@dataclass
class Features:
    """Per position of all chunks, concatenated: ``hidden [N, H]`` float16, ``labels [N]``
    int32 (the target's greedy token for the next position; -1 where that token is not to be
    learned: prompt tokens); ``offsets [C + 1]`` the chunks' bounds; ``heldout [C]`` bool."""

    hidden: Tensor
    labels: Tensor
    offsets: Tensor
    heldout: Tensor

    def positions(self, heldout: bool) -> Tensor:
        """Indices of the positions of the held-out (or training) chunks."""
        parts = [torch.arange(int(self.offsets[c]), int(self.offsets[c + 1]))
                 for c in range(len(self.heldout)) if bool(self.heldout[c]) == heldout]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)

    def digest(self) -> str:
        """A digest of the labels and the chunks' bounds: a checkpoint names the data it was
        trained on by it."""
        return hashlib.sha256(self.labels.numpy().tobytes() + self.offsets.numpy().tobytes()).hexdigest()


def extract_features(
    model: nn.Module, chunks: Sequence[Chunk], heldout_every: int, cache_root: Path, verbose: bool = True,
) -> tuple[Features, float | None]:
    """The target's final hidden states and greedy labels for ``chunks`` (every
    ``heldout_every``-th held out, and the last when none would be), from the cache under
    ``cache_root`` when this model and these chunks were seen before. Returns them and the
    seconds the extraction took (None when read from the cache)."""
    from safetensors.torch import load_file, save_file

    key, stem = cache_key(model, chunks)
    path = cache_root / CACHE_FOLDER / f"{stem}-{key[:20]}.safetensors"
    heldout = torch.tensor([i % heldout_every == heldout_every - 1 for i in range(len(chunks))])
    if not heldout.any():
        heldout[-1] = True
    offsets = torch.tensor([0, *torch.tensor([len(c.ids) for c in chunks]).cumsum(0).tolist()])
    if path.is_file():
        if verbose:
            print(f"[features] from the cache: {path}", flush=True)
        state = load_file(str(path))
        return Features(state["hidden"], state["labels"], offsets, heldout), None

    from tqdm.auto import tqdm

    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()
    device = next(model.parameters()).device
    total = int(offsets[-1])
    hidden, labels = [], []
    start = time.perf_counter()
    with torch.inference_mode(), tqdm(total=total, unit="tok", desc="features", disable=not verbose,
                                      file=sys.stderr) as bar:
        for i, chunk in enumerate(chunks):
            ids = torch.tensor([chunk.ids], device=device)
            h = decoder(input_ids=ids, use_cache=False).last_hidden_state[0]
            greedy = lm_head(h).argmax(-1).to(torch.int32)
            greedy[: max(chunk.start - 1, 0)] = -1  # they predict prompt tokens
            hidden.append(h.to("cpu", torch.float16))
            labels.append(greedy.cpu())
            if i == 0 and verbose:
                first = time.perf_counter() - start
                bar.write(f"[features] extraction: {total} tokens; the first {len(chunk.ids)} took "
                          f"{first:.1f} s: about {first * total / len(chunk.ids) / 60:.1f} min in all")
            bar.update(len(chunk.ids))
    elapsed = time.perf_counter() - start
    features = Features(torch.cat(hidden), torch.cat(labels), offsets, heldout)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    save_file({"hidden": features.hidden, "labels": features.labels}, str(tmp))
    os.replace(tmp, path)
    if verbose:
        print(f"[features] {total} tokens in {elapsed:.0f} s ({total / elapsed:.0f} tok/s), cached in {path}",
              flush=True)
    return features, elapsed


def commonest_ids(labels: Tensor, n: int) -> Tensor:
    """The ``n`` most frequent ids among ``labels >= 0``, commonest first (ties: lower id first);
    fewer where fewer distinct ids occur.

    Example:
        >>> commonest_ids(torch.tensor([7, 7, 7, 3, 3, 9, -1, 5, 5, 5, 5]), 3).tolist()
        [5, 7, 3]
    """
    labels = labels[labels >= 0].long()
    counts = torch.bincount(labels)
    ids = torch.nonzero(counts).flatten()
    order = torch.argsort(-counts[ids], stable=True)  # ids ascend, so ties keep the lower id first
    return ids[order][:n]


def head_targets(features: Features, num_heads: int) -> Tensor:
    """``[N, K]``: the target id head k (column k - 1) learns at each position, the target's
    greedy token for position t + k + 1 (``labels[t + k]``); -1 past the chunk's end and where
    that token is not learned.

    Example (two chunks; ``labels[t]`` is the target's token for position t + 1):
        >>> f = Features(hidden=torch.zeros(5, 8), labels=torch.tensor([11, 12, 13, 21, 22]),
        ...              offsets=torch.tensor([0, 3, 5]), heldout=torch.tensor([False, True]))
        >>> head_targets(f, num_heads=2).tolist()  # head 1 at t = 0: token 2, the target's 12
        [[12, 13], [13, -1], [-1, -1], [22, -1], [-1, -1]]
    """
    n = len(features.labels)
    labels = features.labels.long()
    chunk_end = torch.repeat_interleave(features.offsets[1:], features.offsets.diff())
    t = torch.arange(n)
    columns = []
    for k in range(1, num_heads + 1):
        inside = t + k < chunk_end
        columns.append(torch.where(inside, labels[(t + k).clamp_max(n - 1)], -1))
    return torch.stack(columns, 1)


def cache_key(model: nn.Module, chunks: Sequence[Chunk], *settings: int) -> tuple[str, str]:
    """A digest of the model, the chunks and ``settings`` (numbers the cached result depends
    on), and a readable file name stem."""
    config = model.config
    name = getattr(config, "name_or_path", "") or type(model).__name__
    embedding = model.get_input_embeddings().weight
    h = hashlib.sha256()
    h.update(json.dumps([name, str(embedding.dtype), config.hidden_size, embedding.shape[0],
                         getattr(config, "num_hidden_layers", None)]).encode())
    # Two checkpoints of one architecture under one name differ here.
    h.update(embedding[:8].detach().float().cpu().numpy().tobytes())
    for chunk in chunks:
        h.update(json.dumps([chunk.start, chunk.ids]).encode())
    if settings:
        h.update(json.dumps(settings).encode())
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name or name)
    return h.hexdigest(), f"{stem}-{str(embedding.dtype).removeprefix('torch.')}"
