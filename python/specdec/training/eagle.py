"""Training an EAGLE drafter (:mod:`specdec.proposers.eagle.drafter`) on a frozen target by
self-distillation, sized for a CPU.

Data: the chunks and cached features Medusa's training uses (:mod:`specdec.training.corpus`,
:mod:`specdec.training.features`; the same cache, keyed by the dtype the passes ran in, so data
made once serves both): per position t of a chunk of tokens ``x``, the target's final hidden state
``f_t`` (after the final norm) and its greedy token ``g_t = labels[t]`` for position t + 1
(-1: not learned, the prompt of a chat-wrapped chunk).

Entry t of the drafter reads ``(f_t, x_{t+1})`` (t = 0 .. n - 2) and learns

* the next feature ``f_{t+1}``: smooth-L1, weight 1.0 (EAGLE's loss and weight: post-norm
  features carry a few dimensions far larger than the rest, which a squared error would let
  dominate; the regression is what keeps the predicted features usable as the next depth's
  input), and
* the target's token for position t + 2, ``labels[t + 1]``: cross-entropy of the scores over
  the drafter's ``draft_vocab_size`` ids, weight 0.1 (EAGLE's: cross-entropy over thousands of ids
  is several nats where the per-dimension regression is a fraction of one, so at weight 1 it
  would drown the regression; it aligns the features with the tokens that decide acceptance).
  Ids outside the drafter's vocabulary are not learned (their feature still is). The
  vocabulary: the training labels' commonest ids, then the lowest others up to
  ``draft_vocab_size`` (EAGLE-3's reduced vocabulary; the drafter keeps them as ``vocab_ids``).

Training-time test (EAGLE-3's): at decode time depths 2 and beyond read the drafter's own
predicted features, which teacher forcing never shows it. So each batch is rolled out to depth
``train_depth`` (:func:`specdec.training.eagle_rollout.rollout`, the function the held-out
accuracy drafts with, here with gradients through the fed-back features): the depth-d entry of
the draft started at s reads the feature its depth-(d-1) entry predicted and the text's token
``x_{s+d}``, and learns ``f_{s+d}`` and ``labels[s + d]`` with the two losses above, weighted
``depth_decay ** (d - 1)``; depth 1 is the teacher-forced entry t = s. Each depth costs about
one more epoch's time.

The target's passes over the data (its continuations and its features) run in ``data_dtype``:
by default bfloat16 where the target is float32 on a device that multiplies bfloat16 natively
(CUDA; a CPU with AVX512-BF16 or AMX), on a copy (:func:`specdec.training.loop.data_passes_model`)
dropped once the data is made: several times cheaper passes, and features that differ from the
float32 target's by rounding, which the drafter does not notice (docs/benchmarks.md has the
measurement). The drafter itself is made from, and drafts for, the target as given.

Only positions whose label is learned count. A batch is a few whole chunks, right-padded: a
draft's entries see positions up to its start only, so padding never reaches a real position,
and it is left out of the losses. Every ``heldout_every``-th chunk is held out: its accuracy is
measured drafting from the drafter's own features, as decoding drafts, after every epoch and at
the end. The training checkpoints every epoch in ``out_dir`` and ``resume=True`` continues it
(:mod:`specdec.training.loop`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdec.proposers.eagle.drafter import EagleDrafter
from specdec.proposers.vocab import head_rows
from specdec.training.corpus import DataFiles
from specdec.training.eagle_rollout import evaluate, rollout
from specdec.training.features import Features, commonest_ids
from specdec.training.loop import (CHECKPOINT, Checkpoint, Reporter, accuracy_report, cached, check_settings,
                                   fit, native_bf16, training_data, write_results)

__all__ = ["EagleTrainConfig", "cached_eagle", "depth_losses", "train_eagle", "vocabulary"]


@dataclass(frozen=True)
class EagleTrainConfig:
    """What :func:`train_eagle` does; the fields besides its arguments are fixed choices.

    ``num_tokens``: tokens of text run through the target (training and held-out together).
    ``draft_vocab_size``: how many ids the drafter scores (the module's docstring; the default
    suits the default budget: a small training set learns a few thousand common ids faster than
    a wide softmax, and the head is much of each step's cost). ``batch_size``:
    whole chunks per step. ``heldout_every``: every n-th chunk is held out. ``feature_weight``,
    ``token_weight``: the losses' weights (the module's docstring says why these).
    ``grad_clip``: the gradient's norm is clipped to it (EAGLE's 0.5). ``depth``: the held-out
    accuracy is measured at depths 1 .. depth. ``train_depth``: the depths trained drafting from
    the drafter's own features (1: teacher-forced only); ``depth_decay``: depth d's losses are
    weighted ``depth_decay ** (d - 1)`` (EAGLE-3's 0.8, not tuned here). ``regenerate``: train
    on the target's own continuations of the data's prompts (:mod:`specdec.training.regenerate`).
    ``mixed_precision``: the drafter's products in bfloat16 (``torch.autocast``; its weights and
    the optimizer in float32) where the device multiplies bfloat16 natively (CUDA; CPUs with
    AVX512-BF16 or AMX, :func:`specdec.model.prepare.bf16_packable`), float32 elsewhere: steps
    several times faster at the same accuracy (docs/benchmarks.md). ``data_dtype``: the dtype of
    the target's passes over the data, ``"auto"`` (bfloat16 for a float32 target where the device
    multiplies bfloat16 natively, else the target's own) or a dtype's name (the module's
    docstring).
    """

    num_tokens: int = 40_000
    draft_vocab_size: int = 2048
    chunk_tokens: int = 256
    heldout_every: int = 10
    epochs: int = 10
    batch_size: int = 4
    lr: float = 5e-4
    feature_weight: float = 1.0
    token_weight: float = 0.1
    grad_clip: float = 0.5
    depth: int = 5
    train_depth: int = 3
    depth_decay: float = 0.8
    regenerate: bool = True
    mixed_precision: bool = True
    data_dtype: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        check_settings(self, "train_eagle", ("num_tokens", "draft_vocab_size", "epochs", "batch_size", "depth",
                                             "train_depth"))
        if not self.lr > 0:
            raise ValueError(f"train_eagle: lr must be > 0, got {self.lr}")
        if not 0 < self.depth_decay <= 1:
            raise ValueError(f"train_eagle: depth_decay must be in (0, 1], got {self.depth_decay}")


def train_eagle(
    model: nn.Module,
    tokenizer: Any,
    out_dir: str | os.PathLike[str],
    num_tokens: int = 40_000,
    draft_vocab_size: int = 2048,
    data: DataFiles = None,
    *,
    epochs: int = 10,
    train_depth: int = 3,
    batch_size: int = 4,
    lr: float = 5e-4,
    chunk_tokens: int = 256,
    regenerate: bool = True,
    mixed_precision: bool = True,
    data_dtype: str = "auto",
    resume: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    verbose: bool = True,
    seed: int = 0,
) -> EagleDrafter:
    """Train an EAGLE drafter for ``model`` (:meth:`EagleDrafter.for_target`: the target's last
    layer, its embedding and the rows of its LM head for ``draft_vocab_size`` ids: the training
    labels' commonest, then the lowest others) and save it in ``out_dir``.

    ``data``: None (Python sources of the installed packages, chat-wrapped for chat models),
    or a text file, a JSONL file (``{"text": ...}`` per line) or a list of those; with
    ``regenerate`` (the default) the target writes each chunk past its prompt, as for
    :func:`specdec.train_medusa`. Writes ``out_dir/config.json`` and ``drafter.safetensors`` (:meth:`EagleDrafter.load`
    reads them), ``metrics.json`` (held-out top-1/top-5 accuracy per depth, drafting from its
    own features, and the per-rank table ``[depth, ranks]``, as Medusa's per head; also in
    ``config.json`` and on the returned drafter), and ``out_dir/checkpoint/`` after every
    epoch; ``resume=True`` continues from there with the same settings. ``mixed_precision``:
    bfloat16 products where the device has them; ``data_dtype``: the dtype of the target's passes
    over the data, by default bfloat16 where the device has those products (both:
    :class:`EagleTrainConfig`). ``batch_size`` counts
    whole chunks (of ``chunk_tokens``). ``train_depth``: depths 2 .. train_depth are trained
    drafting from the drafter's own features, as decoding drafts (the module's docstring). The
    target is not changed (its parameters are frozen while the drafter trains, then as they
    were).

    Budget: the target's forward over ``num_tokens`` tokens (the features; cached) and, per
    epoch and trained depth, the drafter's forward and backward over them: one decoder layer,
    ``fc`` and the reduced LM head, about ``3 * layer + 2 * fc + 2 * head`` multiply-adds per
    position, in parameters (the forward, then both gradients of the layer, only the weight's of
    ``fc``, whose inputs are data, only the input's of the frozen head): 0.1 GFLOP per position
    for SmolLM2-135M, 0.5 for Qwen2.5-Coder-1.5B. An epoch at ``train_depth`` 3 costs about
    three teacher-forced ones. AdamW at 5e-4, gradient norm clipped to 0.5, decayed by a cosine
    over batches of 4 chunks. The defaults (40k tokens, 10 epochs) are sized for a model of
    1-2B parameters within half an hour on a 2-core CPU with bfloat16 products; without them
    (``mixed_precision`` has no effect there) training takes several times as long: give a
    large model fewer tokens or epochs there. More tokens raise the accuracy at every depth.
    Measured times and accuracies: docs/benchmarks.md ("EAGLE and Medusa").

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
        >>> drafter = train_eagle(target, Chars(), d / "drafter", draft_vocab_size=100, data=d / "text.txt",
        ...                       epochs=2, chunk_tokens=64, cache_dir=d / "cache", verbose=False)
        >>> drafter.rank_accuracy.shape, len(drafter.metrics["top1"])  # depths 1-5, ranks 1-10
        (torch.Size([5, 10]), 5)
        >>> sorted(p.name for p in (d / "drafter").iterdir())
        ['checkpoint', 'config.json', 'drafter.safetensors', 'metrics.json']
        >>> tmp.cleanup()
    """
    cfg = EagleTrainConfig(num_tokens=num_tokens, draft_vocab_size=draft_vocab_size, chunk_tokens=chunk_tokens,
                           epochs=epochs, train_depth=train_depth, batch_size=batch_size, lr=lr,
                           regenerate=regenerate, mixed_precision=mixed_precision, data_dtype=data_dtype,
                           seed=seed)
    out = Path(out_dir)
    say = Reporter(verbose, "eagle")
    started = time.perf_counter()
    chunks, source, features, made = training_data(model, tokenizer, data, cfg, cache_dir, say)
    ids = torch.tensor([i for chunk in chunks for i in chunk.ids])
    entries = [features.labels[_entries(features, c)] for c in range(len(chunks))]  # their targets' labels
    train = torch.tensor([c for c, e in enumerate(entries) if not features.heldout[c] and (e >= 0).any()],
                         dtype=torch.long)
    train_labels = torch.cat([entries[c] for c in train.tolist()])
    heldout_labels = torch.cat([e for c, e in enumerate(entries) if features.heldout[c]])
    vocab_ids = vocabulary(train_labels, cfg.draft_vocab_size, model.get_output_embeddings().out_features)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)  # any weight for_target does not copy starts the same every run
        drafter = EagleDrafter.for_target(model, vocab_ids=vocab_ids)
    V = drafter.config.draft_vocab_size
    head = _head(model, drafter.vocab_ids, drafter.dtype)
    say(f"[eagle] the drafter scores {V} ids: {_share(train_labels, drafter):.1%} of the training labels; "
        f"{int((train_labels >= 0).sum())} training positions in {len(train)} chunks, "
        f"{int((heldout_labels >= 0).sum())} held-out")

    def heldout_top1(epoch: int) -> str:
        accuracy, _ = evaluate(drafter, ids, features, depth=cfg.depth, head=head)
        return (f"[eagle] epoch {epoch}: held-out top-1 at depths 1-{cfg.depth} "
                + " / ".join(f"{a:.3f}" for a in accuracy[:, 0].tolist()))

    with _frozen(model):
        train_s = _train(drafter, head, ids, features, train, cfg, out / CHECKPOINT, resume, say, heldout_top1)
    eval_start = time.perf_counter()
    rank_accuracy, counts = evaluate(drafter, ids, features, cfg.depth, head=head)
    drafter.rank_accuracy = rank_accuracy
    drafter.metrics = {
        "top1": rank_accuracy[:, 0].tolist(),
        "top5": rank_accuracy[:, :5].sum(1).tolist(),
        "heldout_positions": counts,
        "heldout_in_vocab": _share(heldout_labels, drafter),
        "train_positions": int((train_labels >= 0).sum()),
        "tokens": int(features.offsets[-1]),
        "draft_vocab_size": V,
        "data": source,
        **made,
        "train_seconds": train_s,
        "eval_seconds": time.perf_counter() - eval_start,
        "total_seconds": time.perf_counter() - started,
        "config": asdict(cfg),
    }
    write_results(drafter, out)
    say(_report(drafter))
    return drafter


# --- training --------------------------------------------------------------------------------


def _train(drafter: EagleDrafter, head: Callable[[Tensor], Tensor], ids: Tensor, features: Features,
           chunks: Tensor, cfg: EagleTrainConfig, checkpoint: Path, resume: bool, say: Reporter,
           after_epoch: Callable[[int], str]) -> float:
    state = {"features": features.digest(), **asdict(cfg)}
    weights = torch.tensor([cfg.depth_decay ** d for d in range(cfg.train_depth)])
    per_loss = torch.tensor([cfg.feature_weight, cfg.token_weight])

    def batch_loss(batch: Tensor) -> Tensor:
        tokens, hidden, labels = _batch(ids, features, batch)
        losses = depth_losses(drafter, head, tokens, hidden, labels, cfg.train_depth)
        return weights[:len(losses)].to(losses) @ (losses @ per_loss.to(losses))

    def restore(path: Path) -> None:
        saved = EagleDrafter.load(path).weights()
        with torch.no_grad():
            for name, value in drafter.weights().items():
                value.copy_(saved[name])

    return fit(drafter, chunks, batch_loss, epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
               seed=cfg.seed, checkpoint=Checkpoint(checkpoint, state, restore), resume=resume, say=say,
               desc="drafter", grad_clip=cfg.grad_clip, after_epoch=after_epoch,
               autocast=torch.bfloat16 if cfg.mixed_precision and native_bf16(drafter) else None)


def depth_losses(drafter: EagleDrafter, head: Callable[[Tensor], Tensor], ids: Tensor, hidden: Tensor,
                 labels: Tensor, depth: int) -> Tensor:
    """``[depth, 2]``: per depth d = 1 .. ``depth`` of the drafter's :func:`rollout` over the
    chunks ``ids [B, n]`` (features ``hidden [B, n, H]``, the target's labels ``labels [B, n]``,
    -1 where not learned and in the padding), the feature loss (smooth-L1 against ``f_{s+d}``)
    and the token loss (cross-entropy of ``head``'s scores, the drafter's columns, against
    ``labels[s + d]``) averaged over the starts s whose label is learned (0 where none is; the
    token loss only over labels in the drafter's vocabulary). Deeper entries are fed the text's
    tokens: the labels and features they learn were computed after those (the target's greedy tokens, which decoding's accepted
    drafts follow, would leave an entry's input and its targets on different paths wherever the
    text leaves the greedy one)."""
    rows = []
    for d, predicted in enumerate(rollout(drafter, ids, hidden, depth), 1):
        target = hidden[:, d:].to(predicted.device, predicted.dtype)
        label = labels[:, d:].to(predicted.device)
        learned = label >= 0
        column = drafter.columns(label)
        scored = column >= 0
        zero = predicted.new_zeros(())
        feature = F.smooth_l1_loss(predicted[learned], target[learned]) if learned.any() else zero
        token = F.cross_entropy(head(predicted[scored]), column[scored]) if scored.any() else zero
        rows.append(torch.stack([feature, token]))
    return torch.stack(rows)


def _batch(ids: Tensor, features: Features, chunks: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Whole chunks, right-padded to the longest: their tokens ``[B, n]``, the target's
    features ``[B, n, H]`` and labels ``[B, n]`` (-1 in the padding)."""
    spans = [(int(features.offsets[c]), int(features.offsets[c + 1])) for c in chunks.tolist()]
    B, n, H = len(spans), max(b - a for a, b in spans), features.hidden.shape[1]
    tokens = torch.zeros(B, n, dtype=torch.long)
    hidden = torch.zeros(B, n, H, dtype=features.hidden.dtype)
    labels = torch.full((B, n), -1, dtype=torch.long)
    for i, (a, b) in enumerate(spans):
        tokens[i, :b - a] = ids[a: b]
        hidden[i, :b - a] = features.hidden[a: b]
        labels[i, :b - a] = features.labels[a: b]
    return tokens, hidden, labels


def vocabulary(labels: Tensor, n: int, target_vocab_size: int) -> Tensor:
    """A drafter's ``n`` ids: the commonest of ``labels`` (``>= 0``), then the lowest others.

    Example:
        >>> vocabulary(torch.tensor([7, 7, 3, 9, 9, 9, -1]), 5, target_vocab_size=10).tolist()
        [9, 7, 3, 0, 1]
    """
    n = min(n, target_vocab_size)
    common = commonest_ids(labels, n)
    others = torch.ones(target_vocab_size, dtype=torch.bool)
    others[common] = False
    return torch.cat([common, others.nonzero().flatten()[:n - len(common)]])


def _head(model: nn.Module, vocab_ids: Tensor, dtype: torch.dtype) -> Callable[[Tensor], Tensor]:
    """Scores of ``vocab_ids`` by the target's LM head, as ``drafter.logits`` gives them, from a
    plain copy of its rows in the drafter's dtype: a prepared (packed) head has no backward, and
    a bfloat16 head would not take the drafter's float32 features."""
    weight, bias = head_rows(model.get_output_embeddings(), vocab_ids)  # new tensors
    weight, bias = weight.detach().to(dtype), None if bias is None else bias.detach().to(dtype)
    return lambda features: F.linear(features.to(dtype), weight, bias)


@contextmanager
def _frozen(model: nn.Module) -> Iterator[None]:
    """The target's parameters need no gradient while the drafter trains (the drafter embeds
    with the target's embedding): no gradient is computed for them, none left on them."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def _entries(features: Features, c: int) -> slice:
    """Chunk c's positions 1 .. n - 1: the targets of its drafter entries."""
    return slice(int(features.offsets[c]) + 1, int(features.offsets[c + 1]))


def _share(labels: Tensor, drafter: EagleDrafter) -> float:
    """The share of the learned ``labels`` in the drafter's vocabulary."""
    learned = labels[labels >= 0]
    return float((drafter.columns(learned) >= 0).float().mean()) if len(learned) else 0.0


def _report(drafter: EagleDrafter) -> str:
    m = drafter.metrics or {}
    heading = (f"held-out accuracy drafting from its own features ({m.get('heldout_positions')} positions; "
               f"{m.get('heldout_in_vocab', 0):.1%} of the targets in the drafter's {m.get('draft_vocab_size')} ids):")
    return accuracy_report("eagle", heading, "depth", "D", m, drafter.rank_accuracy)


def cached_eagle(model: nn.Module, tokenizer: Any, name: str,
                 cache_dir: str | os.PathLike[str] | None = None, **train_kwargs: Any) -> EagleDrafter:
    """An EAGLE drafter for ``model`` kept under ``<specdec cache>/eagle-drafters/<name>``:
    loaded (and attached) when there, trained there on first use with :func:`train_eagle`
    (``train_kwargs``) otherwise. ``name`` identifies the model and its dtype (e.g.
    ``"qwen2.5-coder-1.5b-float32"``)."""
    return cached("eagle-drafters", name, cache_dir, lambda path: EagleDrafter.load(path).attach(model),
                  lambda path: train_eagle(model, tokenizer, path, cache_dir=cache_dir, **train_kwargs),
                  "drafter", "eagle")
