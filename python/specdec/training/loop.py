"""What the trainings share (Medusa heads, the EAGLE drafter): the settings checks, progress
lines, the data and its cached features, the epoch loop (AdamW, a cosine learning rate,
batches drawn per epoch from a seed), the per-epoch checkpoint a resumed run continues from,
the held-out accuracy report, the result files and the per-model cache of trained weights.

A resumed run is the uninterrupted one: the learning rate is a function of the step alone, the
batches of an epoch come from ``seed + epoch``, and the checkpoint holds the optimizer's state
next to the weights; it refuses a checkpoint made with other settings or data.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from specdec.model.prepare import PackingConfig, bf16_packable, copy_in_dtype, pack_linear_layers
from specdec.models import cache_dir as default_cache_dir
from specdec.training.corpus import MIN_CHUNK_TOKENS, Chunk, DataFiles, build_chunks
from specdec.training.features import Features, extract_features
from specdec.training.regenerate import regenerate

__all__ = ["CHECKPOINT", "DATA_DTYPES", "Checkpoint", "Reporter", "accuracy_report", "cached", "check_settings",
           "cosine_lr", "data_passes_model", "fit", "native_bf16", "save_checkpoint", "training_data", "write_results"]

CHECKPOINT = "checkpoint"  # the folder under a training's out_dir
DATA_DTYPES = ("auto", "float32", "bfloat16", "float16")  # what data_passes_model takes

T = TypeVar("T")


class Reporter:
    """Prints progress lines when verbose; ``name`` ("medusa", "eagle") names the training in
    its messages (``[name] ...``, ``train_name(...)``)."""

    def __init__(self, verbose: bool, name: str) -> None:
        self.verbose = verbose
        self.name = name

    def __call__(self, message: str) -> None:
        if self.verbose:
            print(message, flush=True)


def check_settings(settings: Any, caller: str, positive: Sequence[str]) -> None:
    """Raise ValueError unless the ``positive`` fields of ``settings`` are >= 1 and its
    ``chunk_tokens``, ``heldout_every`` and ``data_dtype`` are usable."""
    for name in positive:
        if getattr(settings, name) < 1:
            raise ValueError(f"{caller}: {name} must be >= 1, got {getattr(settings, name)}")
    if settings.chunk_tokens < MIN_CHUNK_TOKENS:
        raise ValueError(f"{caller}: chunk_tokens must be >= {MIN_CHUNK_TOKENS}, got {settings.chunk_tokens}")
    if settings.heldout_every < 2:
        raise ValueError(f"{caller}: heldout_every must be >= 2, got {settings.heldout_every}")
    if settings.data_dtype not in DATA_DTYPES:
        raise ValueError(f"{caller}: data_dtype must be one of {', '.join(DATA_DTYPES)}, got {settings.data_dtype!r}")


def training_data(model: nn.Module, tokenizer: Any, data: DataFiles, settings: Any,
                  cache_dir: str | os.PathLike[str] | None, say: Reporter,
                  ) -> tuple[list[Chunk], str, Features, dict[str, Any]]:
    """The chunks of ``data`` (``settings``: ``num_tokens``, ``chunk_tokens``, ``seed``; with
    ``settings.regenerate`` the target's continuations of their prompts), where they come from,
    and the target's features over them with every ``settings.heldout_every``-th chunk held out
    (cached under ``cache_dir``, default the specdec cache), and what making them took, for the
    training's metrics: the seconds of the extraction (``feature_seconds``) and of the
    continuations (``regenerate_seconds``; None where cached) and the dtype the target's passes
    ran in (``data_dtype``: :func:`data_passes_model` with ``settings.data_dtype``; a copy is
    dropped before returning)."""
    model = data_passes_model(model, settings.data_dtype, say)
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    # Continuations may stop early: more prompts than chunks of the data would fill the budget.
    chunks, source = build_chunks(tokenizer, data, num_tokens=settings.num_tokens * (3 if settings.regenerate else 1),
                                  chunk_tokens=settings.chunk_tokens, seed=settings.seed)
    made: dict[str, Any] = {"data_dtype": str(next(model.parameters()).dtype).removeprefix("torch.")}
    if settings.regenerate:
        chunks, made["regenerate_seconds"] = regenerate(model, tokenizer, chunks, settings.num_tokens,
                                                        settings.chunk_tokens, cache_root, say.verbose)
        source = f"the target's continuations of the prompts of {source}"
    say(f"[{say.name}] data: {source}: {len(chunks)} chunks, {sum(len(c.ids) for c in chunks)} tokens")
    features, made["feature_seconds"] = extract_features(model, chunks, settings.heldout_every, cache_root,
                                                        say.verbose)
    return chunks, source, features, made


def native_bf16(module: nn.Module) -> bool:
    """Whether the module's device multiplies bfloat16 natively (CUDA; a CPU with AVX512-BF16
    or AMX)."""
    return next(module.parameters()).device.type == "cuda" or bf16_packable()


def data_passes_model(model: nn.Module, data_dtype: str, say: Reporter) -> nn.Module:
    """The model a training's passes over its data run on: ``model`` itself in its own dtype,
    else a copy in ``data_dtype`` (one of ``DATA_DTYPES``; "auto": bfloat16 for a float32 model
    where :func:`native_bf16`, else its own), prepared for wide passes on a CPU (oneDNN's packed
    products; :func:`specdec.model.prepare.copy_in_dtype` leaves ``model`` as it is)."""
    own = next(model.parameters()).dtype
    if data_dtype == "auto":
        dtype = torch.bfloat16 if own == torch.float32 and native_bf16(model) else own
    else:
        dtype = getattr(torch, data_dtype)
    if dtype == own:
        return model
    say(f"[{say.name}] the data's passes run on a {str(dtype).removeprefix('torch.')} copy of the target")
    return pack_linear_layers(copy_in_dtype(model, dtype), PackingConfig(kernel="onednn"))


def write_results(module: nn.Module, out: Path) -> None:
    """``module.save(out)`` (its weights, config, metrics and per-rank table) and
    ``out/metrics.json`` (the metrics and the per-rank table alone)."""
    module.save(out)
    (out / "metrics.json").write_text(json.dumps({**module.metrics, "rank_accuracy": module.rank_accuracy.tolist()},
                                                 indent=2) + "\n")


def cosine_lr(lr: float, step: int, total_steps: int) -> float:
    """The learning rate at ``step`` of ``total_steps``: ``lr`` decayed to 0 by a half cosine.

    Example:
        >>> [round(cosine_lr(1.0, s, 4), 3) for s in range(4)]
        [1.0, 0.854, 0.5, 0.146]
    """
    return lr * 0.5 * (1 + math.cos(math.pi * step / total_steps))


@dataclass(frozen=True)
class Checkpoint:
    """A training's per-epoch checkpoint: the folder, the ``state`` naming its settings and data
    (a resumed run must have the same), and ``restore(folder)``, which loads the saved weights
    into the module being trained."""

    path: Path
    state: dict[str, Any]
    restore: Callable[[Path], object]


def fit(module: nn.Module, items: Tensor, batch_loss: Callable[[Tensor], Tensor], *, epochs: int,
        batch_size: int, lr: float, seed: int, checkpoint: Checkpoint, resume: bool, say: Reporter,
        desc: str, grad_clip: float | None = None, after_epoch: Callable[[int], str] | None = None,
        autocast: torch.dtype | None = None) -> float:
    """Train ``module``'s parameters that require grad with AdamW: ``epochs`` passes over
    ``items`` (positions, chunks: what ``batch_loss`` takes) in batches of ``batch_size``,
    shuffled per epoch from ``seed + epoch``, at a cosine-decayed ``lr``, the gradient's norm
    clipped to ``grad_clip`` if given; a progress bar ``desc`` on stderr. After each epoch the
    checkpoint is saved and ``after_epoch(epoch)``'s line (1-based) printed. ``resume``:
    continue from the checkpoint. ``autocast``: the losses are computed under
    ``torch.autocast`` in that dtype (matrix products in it; the weights, their gradients and
    the optimizer stay in theirs). Returns the seconds spent."""
    from tqdm.auto import tqdm

    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    first_epoch = _resume(optimizer, checkpoint, say) if resume else 0
    # The learning rate follows the planned number of steps: a resumed run plans the same.
    steps_per_epoch = math.ceil(len(items) / batch_size)
    total_steps = steps_per_epoch * epochs
    start = time.perf_counter()
    module.train()
    with tqdm(total=total_steps, initial=first_epoch * steps_per_epoch, desc=desc, unit="step",
              disable=not say.verbose, file=sys.stderr) as bar:
        for epoch in range(first_epoch, epochs):
            # Seeded per epoch, so a resumed run draws the batches an uninterrupted one would.
            order = items[torch.randperm(len(items), generator=torch.Generator().manual_seed(seed + epoch))]
            for step in range(steps_per_epoch):
                for group in optimizer.param_groups:
                    group["lr"] = cosine_lr(lr, epoch * steps_per_epoch + step, total_steps)
                with torch.autocast(params[0].device.type, dtype=autocast, enabled=autocast is not None):
                    loss = batch_loss(order[step * batch_size: (step + 1) * batch_size])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(params, grad_clip)
                optimizer.step()
                bar.set_postfix(epoch=epoch + 1, loss=f"{loss.item():.3f}", refresh=False)
                bar.update()
            save_checkpoint(module, optimizer, checkpoint.path, {**checkpoint.state, "epoch": epoch + 1})
            if after_epoch is not None and say.verbose:
                bar.write(after_epoch(epoch + 1))
                module.train()
    module.eval()
    return time.perf_counter() - start


def save_checkpoint(module: nn.Module, optimizer: torch.optim.Optimizer, checkpoint: Path,
                    state: dict[str, Any]) -> None:
    """Write ``module.save(checkpoint)``, the optimizer's state and ``state.json`` (``state``,
    which names the epoch the checkpoint holds)."""
    module.save(checkpoint)
    tmp = checkpoint / "optimizer.pt.tmp"
    torch.save(optimizer.state_dict(), tmp)
    os.replace(tmp, checkpoint / "optimizer.pt")
    # Written last: a checkpoint counts only once its state names the epoch it holds.
    (checkpoint / "state.json.tmp").write_text(json.dumps(state, indent=2) + "\n")
    os.replace(checkpoint / "state.json.tmp", checkpoint / "state.json")


def _resume(optimizer: torch.optim.Optimizer, checkpoint: Checkpoint, say: Reporter) -> int:
    """The epoch to continue from, after loading the checkpoint's weights and optimizer."""
    path = checkpoint.path / "state.json"
    if not path.is_file():
        say(f"[{say.name}] resume: no checkpoint in {checkpoint.path}: training from the start")
        return 0
    saved = json.loads(path.read_text())
    differ = sorted(k for k in checkpoint.state if saved.get(k) != checkpoint.state[k])
    if differ:
        raise ValueError(f"train_{say.name}(resume=True): the checkpoint in {checkpoint.path} was made with "
                         f"other settings or data ({', '.join(differ)} differ); resume with the same ones or "
                         f"start over")
    checkpoint.restore(checkpoint.path)
    optimizer.load_state_dict(torch.load(checkpoint.path / "optimizer.pt", weights_only=True))
    say(f"[{say.name}] resuming after epoch {saved['epoch']} from {checkpoint.path}")
    return saved["epoch"]


def accuracy_report(name: str, heading: str, row: str, rows: str, metrics: dict[str, Any],
                    rank_accuracy: Tensor) -> str:
    """The held-out accuracy table a training prints: per ``row`` (head k, depth k: predicting
    token t + k + 1) top-1 and top-5, the per-rank table ``[rows, ranks]`` and the time spent."""
    w = len(row)
    lines = [f"[{name}] {heading}", f"{row}  predicts  top-1   top-5"]
    for k, (top1, top5) in enumerate(zip(metrics["top1"], metrics["top5"]), 1):
        lines.append(f"{k:{w}d}  t+{k + 1:<7d} {top1:.3f}   {top5:.3f}")
    lines.append(f"per-rank accuracy [{rows}, {rank_accuracy.shape[1]}] "
                 f"(P(rank-r candidate is the target's token)):")
    for k, ranks in enumerate(rank_accuracy.tolist(), 1):
        lines.append(f"{k:{w}d}  " + " ".join(f"{p:.3f}" for p in ranks))

    def took(key: str) -> str:
        return "cached" if metrics.get(key) is None else f"{metrics[key]:.0f} s"

    written = f"continuations {took('regenerate_seconds')}, " if "regenerate_seconds" in metrics else ""
    lines.append(f"[{name}] {written}features {took('feature_seconds')}, training "
                 f"{metrics.get('train_seconds', 0):.0f} s, total {metrics.get('total_seconds', 0):.0f} s")
    return "\n".join(lines)


def cached(folder: str, name: str, cache_dir: str | os.PathLike[str] | None, load: Callable[[Path], T],
           train: Callable[[Path], T], what: str, tag: str) -> T:
    """Weights kept under ``<specdec cache>/<folder>/<name>``: ``load(path)`` when there (a
    ``config.json`` in it), else ``train(path)``, once."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / folder / re.sub(r"[^\w.-]", "_", name)
    if (path / "config.json").is_file():
        return load(path)
    print(f"[{tag}] no {what} cached for {name}: training once, into {path}", file=sys.stderr)
    return train(path)
