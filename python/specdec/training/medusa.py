"""Training Medusa-1 heads on a frozen target by self-distillation, sized for a CPU.

The heads read the target's final hidden states ``h_t`` and learn its greedy tokens ``g_t``
(:mod:`specdec.training.features`, over the chunks of :mod:`specdec.training.corpus`): head k
(1-based) at position t learns ``g_{t+k}``, the target's own token for position t + k + 1, so
the heads imitate what the target will emit, not what the text says. Every 10th chunk is held
out to measure the heads' accuracies. The head training checkpoints every epoch in ``out_dir``
and ``resume=True`` continues it; the features are cached, so a rerun costs only the head
training.

Budget: feature extraction dominates and costs what a forward over ``num_tokens`` tokens costs;
see ``train_medusa``.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdec.proposers.medusa.heads import RANKS, MedusaHeads
from specdec.training.corpus import DataFiles
from specdec.training.features import commonest_ids, head_targets
from specdec.training.loop import (CHECKPOINT, Checkpoint, Reporter, accuracy_report, cached, check_settings,
                                   fit, training_data, write_results)

__all__ = ["TrainConfig", "cached_heads", "train_medusa"]


@dataclass(frozen=True)
class TrainConfig:
    """What :func:`train_medusa` does; every field is one of its arguments.

    ``num_tokens``: tokens of text run through the target (training and held-out together).
    ``vocab_size``: the heads score at most this many ids, the commonest labels of the
    training split. ``regenerate``: train on the target's own continuations of the data's
    prompts (:mod:`specdec.training.regenerate`), else on the data's text. ``heldout_every``:
    every n-th chunk is held out. ``loss_decay``: head k's
    loss weight is ``loss_decay ** (k - 1)`` (later heads are less accurate and matter less:
    a tree reaches them only through the earlier ones). ``data_dtype``: the dtype of the target's
    passes over the data, ``"auto"`` (bfloat16 for a float32 target where the device multiplies
    bfloat16 natively, else the target's own) or a dtype's name, as :func:`specdec.train_eagle`'s:
    with the same settings both read one cache.
    """

    num_heads: int = 3
    num_layers: int = 1
    num_tokens: int = 40_000
    vocab_size: int = 32_768
    chunk_tokens: int = 256
    heldout_every: int = 10
    epochs: int = 6
    batch_size: int = 128
    lr: float = 1e-3
    loss_decay: float = 0.8
    regenerate: bool = True
    data_dtype: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        check_settings(self, "train_medusa",
                       ("num_heads", "num_layers", "num_tokens", "vocab_size", "epochs", "batch_size"))


def train_medusa(
    model: nn.Module,
    tokenizer: Any,
    out_dir: str | os.PathLike[str],
    num_heads: int = 3,
    num_tokens: int = 40_000,
    vocab_size: int = 32_768,
    data: DataFiles = None,
    *,
    num_layers: int = 1,
    epochs: int = 6,
    batch_size: int = 128,
    lr: float = 1e-3,
    chunk_tokens: int = 256,
    regenerate: bool = True,
    data_dtype: str = "auto",
    resume: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    verbose: bool = True,
    seed: int = 0,
) -> MedusaHeads:
    """Train ``num_heads`` Medusa-1 heads for ``model`` and save them in ``out_dir``.

    ``data``: None (Python sources of the installed packages, chat-wrapped for chat models),
    or a text file, a JSONL file (``{"text": ...}`` per line) or a list of those. With
    ``regenerate`` (the default) the target writes the text it learns from: each chunk's prompt
    (a chat chunk's request, else its first 32 tokens) is kept and the rest is the target's
    greedy continuation (:mod:`specdec.training.regenerate`: heads learn what the target writes,
    not what the data says; held-out accuracy is then on the target's own text, as in decoding);
    ``regenerate=False`` learns from the data as it is. Writes ``out_dir/config.json`` and
    ``heads.safetensors`` (:meth:`MedusaHeads.load`
    reads them), ``metrics.json`` (held-out top-1/top-5 accuracy per head and the per-rank
    table, also in ``config.json`` and on the returned heads), and ``out_dir/checkpoint/``
    after every epoch; ``resume=True`` continues from there with the same settings.

    Defaults: the target's passes over the data are most of the cost (on a bfloat16 copy of a
    float32 target where the CPU multiplies bfloat16 natively: ``data_dtype``), so
    ``num_tokens=40_000`` keeps the training of a 1.5B target to minutes on a 2-core CPU with
    AVX512-BF16 and makes the same data as :func:`specdec.train_eagle`'s defaults, cached once
    for both (docs/benchmarks.md, run 19, has what the budget buys). ``vocab_size=32_768`` is a
    cap: 40k tokens of labels hold a few thousand distinct ids, and with much more data the
    commonest 32k cover nearly all the targets, while the heads' output GEMM stays a fifth of a
    152k-row LM head. ``epochs=6``, batches of 128 positions, AdamW at 1e-3 decayed by a
    cosine. docs/benchmarks.md (Medusa) has the measurements behind these.

    Example (a tiny random model and a one-id-per-character tokenizer, a second or two):
        >>> import pathlib, tempfile
        >>> from types import SimpleNamespace
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> target = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
        ...                                       num_hidden_layers=1, num_attention_heads=2)).eval()
        >>> target.generation_config.eos_token_id = None  # no end-of-text token: continuations run full
        >>> class Chars:
        ...     chat_template = None
        ...     def __call__(self, text):
        ...         return SimpleNamespace(input_ids=[ord(c) for c in text])
        >>> tmp = tempfile.TemporaryDirectory()
        >>> d = pathlib.Path(tmp.name)
        >>> _ = (d / "text.txt").write_text("abcdefgh" * 200)
        >>> heads = train_medusa(target, Chars(), d / "heads", num_heads=2, data=d / "text.txt",
        ...                      chunk_tokens=64, cache_dir=d / "cache", verbose=False)
        >>> heads.rank_accuracy.shape, sorted(p.name for p in (d / "heads").glob("*.json"))
        (torch.Size([2, 10]), ['config.json', 'metrics.json'])
        >>> tmp.cleanup()
    """
    cfg = TrainConfig(num_heads=num_heads, num_layers=num_layers, num_tokens=num_tokens,
                      vocab_size=vocab_size, chunk_tokens=chunk_tokens, epochs=epochs,
                      batch_size=batch_size, lr=lr, regenerate=regenerate, data_dtype=data_dtype, seed=seed)
    out = Path(out_dir)
    say = Reporter(verbose, "medusa")
    started = time.perf_counter()
    _, source, features, made = training_data(model, tokenizer, data, cfg, cache_dir, say)

    train_pos, test_pos = features.positions(heldout=False), features.positions(heldout=True)
    targets = head_targets(features, cfg.num_heads)  # [N, K] target ids, -1: none
    vocab_ids = commonest_ids(features.labels[train_pos], cfg.vocab_size)
    heads = MedusaHeads.for_target(model, cfg.num_heads, vocab_ids, cfg.num_layers)
    id_map = torch.full((heads.config.target_vocab_size,), -1, dtype=torch.long)
    id_map[vocab_ids] = torch.arange(len(vocab_ids))
    mapped = torch.where(targets >= 0, id_map[targets.clamp_min(0)], -1)  # column in the heads' output
    train_pos = train_pos[(mapped[train_pos] >= 0).any(1)]
    say(f"[medusa] {len(vocab_ids)} ids in the heads' vocabulary; {len(train_pos)} training positions, "
        f"{int((targets[test_pos] >= 0).any(1).sum())} held-out")

    train_s = _train(heads, features.hidden, mapped, train_pos, cfg, out / CHECKPOINT,
                     features.digest(), resume, say)
    rank_accuracy, counts = evaluate(heads, features.hidden[test_pos], targets[test_pos])
    heads.rank_accuracy = rank_accuracy
    covered = targets[test_pos][targets[test_pos] >= 0]
    heads.metrics = {
        "top1": rank_accuracy[:, 0].tolist(),
        "top5": rank_accuracy[:, :5].sum(1).tolist(),
        "heldout_positions": counts,
        "heldout_in_vocab": float((id_map[covered] >= 0).float().mean()) if len(covered) else 0.0,
        "train_positions": len(train_pos),
        "tokens": int(features.offsets[-1]),
        "vocab_size": len(vocab_ids),
        "data": source,
        **made,
        "train_seconds": train_s,
        "total_seconds": time.perf_counter() - started,
        "config": asdict(cfg),
    }
    write_results(heads, out)
    say(_report(heads))
    return heads


@torch.no_grad()
def evaluate(heads: MedusaHeads, hidden: Tensor, targets: Tensor, batch: int = 1024) -> tuple[Tensor, int]:
    """The per-rank accuracy table ``[K, RANKS]`` (entry ``[k, r]``: the share of positions
    where head k + 1's rank-r candidate is its target; targets outside the heads' vocabulary
    count as misses) over the positions with a target, and their number (head 1's)."""
    k = min(RANKS, heads.config.vocab_size)
    hits = torch.zeros(heads.config.num_heads, RANKS)
    for i in range(0, len(hidden), batch):
        ids, _ = heads.topk(hidden[i: i + batch].float(), k)
        hits[:, :k] += (ids == targets[i: i + batch, :, None]).sum(0)
    valid = (targets >= 0).sum(0).clamp_min(1)
    return hits / valid[:, None], int(valid[0])


# --- training --------------------------------------------------------------------------------


def _train(heads: MedusaHeads, hidden: Tensor, mapped: Tensor, positions: Tensor, cfg: TrainConfig,
           checkpoint: Path, features_key: str, resume: bool, say: Reporter) -> float:
    vocab_digest = hashlib.sha256(heads.vocab_ids.numpy().tobytes()).hexdigest()
    state = {"features": features_key, "vocab_ids": vocab_digest, **asdict(cfg)}
    weights = torch.tensor([cfg.loss_decay ** k for k in range(cfg.num_heads)])

    def batch_loss(batch: Tensor) -> Tensor:
        logits = heads(hidden[batch].float())  # [B, K, Vh]
        y = mapped[batch]
        losses = F.cross_entropy(logits.transpose(1, 2), y, ignore_index=-1, reduction="none").sum(0)
        return (weights * losses / (y >= 0).sum(0).clamp_min(1)).sum()

    def restore(path: Path) -> None:
        heads.load_state_dict(MedusaHeads.load(path).state_dict())

    return fit(heads, positions, batch_loss, epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
               seed=cfg.seed, checkpoint=Checkpoint(checkpoint, state, restore), resume=resume, say=say,
               desc="heads")


# --- helpers ---------------------------------------------------------------------------------


def _report(heads: MedusaHeads) -> str:
    m = heads.metrics or {}
    heading = (f"held-out accuracy ({m.get('heldout_positions')} positions; "
               f"{m.get('heldout_in_vocab', 0):.1%} of the targets in the heads' {m.get('vocab_size')} ids):")
    return accuracy_report("medusa", heading, "head", "K", m, heads.rank_accuracy)


def cached_heads(model: nn.Module, tokenizer: Any, name: str,
                 cache_dir: str | os.PathLike[str] | None = None, **train_kwargs: Any) -> MedusaHeads:
    """Medusa heads for ``model`` kept under ``<specdec cache>/medusa-heads/<name>``: loaded when
    there, trained there on first use with :func:`train_medusa` (``train_kwargs``) otherwise.
    ``name`` identifies the model and its dtype (e.g. ``"qwen2.5-coder-1.5b-float32"``).

    Heads are not shipped: ours keep only the residual blocks, yet a 1536-wide model's three
    blocks take 28 MB, past what belongs in a package; training says up front how long it will
    take (the feature extraction's projection), minutes for a 1.5B target on a 2-core CPU
    (docs/benchmarks.md).
    """
    return cached("medusa-heads", name, cache_dir, lambda path: MedusaHeads.load(path).attach(model),
                  lambda path: train_medusa(model, tokenizer, path, cache_dir=cache_dir, **train_kwargs),
                  "heads", "medusa")
