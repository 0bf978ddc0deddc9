"""Training Medusa-1 heads on a frozen target by self-distillation, sized for a CPU.

One teacher-forced forward of the target over each chunk of text gives both what the heads
read and what they learn: the final hidden states ``h_t`` (``model.get_decoder()``'s output) and
the target's greedy prediction ``g_t = argmax lm_head(h_t)`` (its token for position t + 1).
Head k (1-based) at position t learns ``g_{t+k}``, the target's own token for position
t + k + 1, so the heads imitate what the target will emit, not what the text says. Features
(float16) and labels (int32) are cached under ``<specdec cache>/medusa-features/``, keyed by
the model (name, dtype, sizes, a fingerprint of its embeddings) and the chunks' token ids, so a
rerun costs only the head training; the head training checkpoints every epoch in ``out_dir``
and ``resume=True`` continues it.

Data by default: Python source files of the installed packages (the standard library and
site-packages), one window of ``chunk_tokens`` tokens from each of many files; for chat models
(the tokenizer has a chat template) the code is the assistant's answer to "Write the Python
module <name>.", and only answer tokens are learned. Every 10th chunk is held out to measure
the heads' accuracies.

Budget (the defaults, on the project's 2-core CPU): feature extraction dominates and costs
what a forward over ``num_tokens`` tokens costs; see ``train_medusa``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import sys
import sysconfig
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdec.proposers.medusa.heads import RANKS, MedusaHeads
from specdec.models import cache_dir as default_cache_dir

__all__ = ["Chunk", "Features", "TrainConfig", "build_chunks", "cached_heads", "extract_features", "head_targets",
           "train_medusa"]

CHECKPOINT = "checkpoint"
MIN_CHUNK_TOKENS = 32  # shorter windows teach little and cost a forward each


@dataclass(frozen=True)
class TrainConfig:
    """What :func:`train_medusa` does; every field is one of its arguments.

    ``num_tokens``: tokens of text run through the target (training and held-out together).
    ``vocab_size``: the heads score at most this many ids, the commonest labels of the
    training split. ``heldout_every``: every n-th chunk is held out. ``loss_decay``: head k's
    loss weight is ``loss_decay ** (k - 1)`` (later heads are less accurate and matter less:
    a tree reaches them only through the earlier ones).
    """

    num_heads: int = 3
    num_layers: int = 1
    num_tokens: int = 20_000
    vocab_size: int = 32_768
    chunk_tokens: int = 256
    heldout_every: int = 10
    epochs: int = 6
    batch_size: int = 128
    lr: float = 1e-3
    loss_decay: float = 0.8
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_heads", "num_layers", "num_tokens", "vocab_size", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"train_medusa: {name} must be >= 1, got {getattr(self, name)}")
        if self.chunk_tokens < MIN_CHUNK_TOKENS:
            raise ValueError(f"train_medusa: chunk_tokens must be >= {MIN_CHUNK_TOKENS}, got {self.chunk_tokens}")
        if self.heldout_every < 2:
            raise ValueError(f"train_medusa: heldout_every must be >= 2, got {self.heldout_every}")


@dataclass(frozen=True)
class Chunk:
    """One forward's tokens; ``start`` is the first token to learn (the answer's first token
    in a chat-wrapped chunk, else 0)."""

    ids: tuple[int, ...]
    start: int = 0


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


def train_medusa(
    model: nn.Module,
    tokenizer: Any,
    out_dir: str | os.PathLike[str],
    num_heads: int = 3,
    num_tokens: int = 20_000,
    vocab_size: int = 32_768,
    data: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    *,
    num_layers: int = 1,
    epochs: int = 6,
    batch_size: int = 128,
    lr: float = 1e-3,
    chunk_tokens: int = 256,
    resume: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    verbose: bool = True,
    seed: int = 0,
) -> MedusaHeads:
    """Train ``num_heads`` Medusa-1 heads for ``model`` and save them in ``out_dir``.

    ``data``: None (Python sources of the installed packages, chat-wrapped for chat models),
    or a text file, a JSONL file (``{"text": ...}`` per line) or a list of those, used as they
    are. Writes ``out_dir/config.json`` and ``heads.safetensors`` (:meth:`MedusaHeads.load`
    reads them), ``metrics.json`` (held-out top-1/top-5 accuracy per head and the per-rank
    table, also in ``config.json`` and on the returned heads), and ``out_dir/checkpoint/``
    after every epoch; ``resume=True`` continues from there with the same settings.

    Defaults, for the 2-core CPU this project is measured on, where the target's forward over
    the data is most of the cost: ``num_tokens=20_000`` fits Qwen2.5-Coder-1.5B's budget of
    30 minutes (measured on the idle machine: 372 s in all, 306 s of it the target's forward;
    SmolLM2-135M: 55 s of forward while other work shared the machine). More data helps, a
    little: on SmolLM2, 60k tokens (4.2 min of features) raised held-out top-1 from
    0.248/0.131/0.102 to 0.274/0.160/0.109 (heads 1-3), where 10 epochs instead of 6 gained
    0.01; give ``--tokens`` where the budget allows. ``vocab_size=32_768`` is a cap: 20k tokens of
    labels hold about 2k distinct ids (SmolLM2: 1978, covering 85% of the held-out targets;
    60k: 3802, 92%); with much more data the commonest 32k ids cover nearly all, while the
    heads' output GEMM stays a fifth of a 152k-row LM head. ``epochs=6``, batches of 128
    positions, AdamW at 1e-3 decayed by a cosine (3e-3 and batches of 64 were no better).

    Example (a tiny random model and a one-id-per-character tokenizer, a second or two):
        >>> import pathlib, tempfile
        >>> from types import SimpleNamespace
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> target = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
        ...                                       num_hidden_layers=1, num_attention_heads=2)).eval()
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
                      batch_size=batch_size, lr=lr, seed=seed)
    out = Path(out_dir)
    say = _Reporter(verbose)
    started = time.perf_counter()
    chunks, source = build_chunks(tokenizer, cfg, data)
    say(f"[medusa] data: {source}: {len(chunks)} chunks, {sum(len(c.ids) for c in chunks)} tokens")
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    features, feature_s = extract_features(model, chunks, cfg.heldout_every, cache_root, verbose)

    train_pos, test_pos = features.positions(heldout=False), features.positions(heldout=True)
    targets = head_targets(features, cfg.num_heads)  # [N, K] target ids, -1: none
    vocab_ids = _commonest(features.labels[train_pos], cfg.vocab_size)
    heads = MedusaHeads.for_target(model, cfg.num_heads, vocab_ids, cfg.num_layers)
    id_map = torch.full((heads.config.target_vocab_size,), -1, dtype=torch.long)
    id_map[vocab_ids] = torch.arange(len(vocab_ids))
    mapped = torch.where(targets >= 0, id_map[targets.clamp_min(0)], -1)  # column in the heads' output
    train_pos = train_pos[(mapped[train_pos] >= 0).any(1)]
    say(f"[medusa] {len(vocab_ids)} ids in the heads' vocabulary; {len(train_pos)} training positions, "
        f"{int((targets[test_pos] >= 0).any(1).sum())} held-out")

    train_s = _train(heads, features.hidden, mapped, train_pos, cfg, out / CHECKPOINT,
                     _features_digest(features), resume, say)
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
        "feature_seconds": feature_s,
        "train_seconds": train_s,
        "total_seconds": time.perf_counter() - started,
        "config": asdict(cfg),
    }
    heads.save(out)
    (out / "metrics.json").write_text(json.dumps({**heads.metrics, "rank_accuracy": rank_accuracy.tolist()},
                                                 indent=2) + "\n")
    say(_report(heads))
    return heads


def build_chunks(
    tokenizer: Any, cfg: TrainConfig, data: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None,
) -> tuple[list[Chunk], str]:
    """The chunks to run through the target (about ``cfg.num_tokens`` tokens) and a description
    of where they come from."""
    if data is None:
        chat = bool(getattr(tokenizer, "chat_template", None))
        chunks = _take(_source_chunks(tokenizer, cfg, chat), cfg.num_tokens)
        source = "Python sources of the installed packages" + (" (chat-wrapped)" if chat else "")
    else:
        paths = [Path(data)] if isinstance(data, (str, os.PathLike)) else [Path(p) for p in data]
        chunks = _take(_text_chunks(tokenizer, cfg, paths), cfg.num_tokens)
        source = ", ".join(str(p) for p in paths)
    if len(chunks) < 2:
        raise ValueError(f"train_medusa: {source} gave {len(chunks)} chunk(s) of at least "
                         f"{MIN_CHUNK_TOKENS} tokens; a training and a held-out chunk are needed")
    return chunks, source


def extract_features(
    model: nn.Module, chunks: Sequence[Chunk], heldout_every: int, cache_root: Path, verbose: bool = True,
) -> tuple[Features, float | None]:
    """The target's final hidden states and greedy labels for ``chunks`` (every
    ``heldout_every``-th held out, and the last when none would be), from the cache when this
    model and these chunks were seen before. Returns them and the seconds the extraction took
    (None when read from the cache)."""
    from safetensors.torch import load_file, save_file

    say = _Reporter(verbose)
    key, stem = _cache_key(model, chunks)
    path = cache_root / "medusa-features" / f"{stem}-{key[:20]}.safetensors"
    heldout = torch.tensor([i % heldout_every == heldout_every - 1 for i in range(len(chunks))])
    if not heldout.any():
        heldout[-1] = True
    offsets = torch.tensor([0, *torch.tensor([len(c.ids) for c in chunks]).cumsum(0).tolist()])
    if path.is_file():
        say(f"[medusa] features from the cache: {path}")
        state = load_file(str(path))
        return Features(state["hidden"], state["labels"], offsets, heldout), None

    from tqdm.auto import tqdm

    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()
    device = next(model.parameters()).device
    total = int(offsets[-1])
    hidden, labels = [], []
    start = time.perf_counter()
    with torch.inference_mode(), tqdm(total=total, unit="tok", desc="features", disable=not say.verbose,
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
                bar.write(f"[medusa] feature extraction: {total} tokens; the first {len(chunk.ids)} took "
                          f"{first:.1f} s: about {first * total / len(chunk.ids) / 60:.1f} min in all")
            bar.update(len(chunk.ids))
    elapsed = time.perf_counter() - start
    features = Features(torch.cat(hidden), torch.cat(labels), offsets, heldout)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    save_file({"hidden": features.hidden, "labels": features.labels}, str(tmp))
    os.replace(tmp, path)
    say(f"[medusa] features: {total} tokens in {elapsed:.0f} s ({total / elapsed:.0f} tok/s), cached in {path}")
    return features, elapsed


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
           checkpoint: Path, features_key: str, resume: bool, say) -> float:
    from tqdm.auto import tqdm

    params = [p for p in heads.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr)
    # The learning rate follows the planned number of steps: a resumed run must plan the same.
    state = {"features": features_key, "vocab_ids": _digest(heads.vocab_ids.numpy().tobytes()), **asdict(cfg)}
    first_epoch = _resume(heads, optimizer, checkpoint, state, say) if resume else 0
    steps_per_epoch = math.ceil(len(positions) / cfg.batch_size)
    total_steps = steps_per_epoch * cfg.epochs
    weights = torch.tensor([cfg.loss_decay ** k for k in range(cfg.num_heads)])
    start = time.perf_counter()
    heads.train()
    with tqdm(total=total_steps, initial=first_epoch * steps_per_epoch, desc="heads", unit="step",
              disable=not say.verbose, file=sys.stderr) as bar:
        for epoch in range(first_epoch, cfg.epochs):
            # Seeded per epoch, so a resumed run draws the batches an uninterrupted one would.
            order = positions[torch.randperm(len(positions), generator=torch.Generator().manual_seed(cfg.seed + epoch))]
            for step in range(steps_per_epoch):
                done = epoch * steps_per_epoch + step
                for group in optimizer.param_groups:  # cosine decay, a function of the step alone
                    group["lr"] = cfg.lr * 0.5 * (1 + math.cos(math.pi * done / total_steps))
                batch = order[step * cfg.batch_size: (step + 1) * cfg.batch_size]
                logits = heads(hidden[batch].float())  # [B, K, Vh]
                y = mapped[batch]
                losses = F.cross_entropy(logits.transpose(1, 2), y, ignore_index=-1, reduction="none").sum(0)
                loss = (weights * losses / (y >= 0).sum(0).clamp_min(1)).sum()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                bar.set_postfix(epoch=epoch + 1, loss=f"{loss.item():.3f}", refresh=False)
                bar.update()
            _save_checkpoint(heads, optimizer, checkpoint, {**state, "epoch": epoch + 1})
    heads.eval()
    return time.perf_counter() - start


def _save_checkpoint(heads: MedusaHeads, optimizer: torch.optim.Optimizer, checkpoint: Path,
                     state: dict[str, Any]) -> None:
    heads.save(checkpoint)
    tmp = checkpoint / "optimizer.pt.tmp"
    torch.save(optimizer.state_dict(), tmp)
    os.replace(tmp, checkpoint / "optimizer.pt")
    # Written last: a checkpoint counts only once its state names the epoch it holds.
    (checkpoint / "state.json.tmp").write_text(json.dumps(state, indent=2) + "\n")
    os.replace(checkpoint / "state.json.tmp", checkpoint / "state.json")


def _resume(heads: MedusaHeads, optimizer: torch.optim.Optimizer, checkpoint: Path,
            state: dict[str, Any], say) -> int:
    """The epoch to continue from, after loading the checkpoint's heads and optimizer."""
    path = checkpoint / "state.json"
    if not path.is_file():
        say(f"[medusa] resume: no checkpoint in {checkpoint}: training from the start")
        return 0
    saved = json.loads(path.read_text())
    differ = sorted(k for k in state if saved.get(k) != state[k])
    if differ:
        raise ValueError(f"train_medusa(resume=True): the checkpoint in {checkpoint} was made with other "
                         f"settings or data ({', '.join(differ)} differ); resume with the same ones or start over")
    heads.load_state_dict(MedusaHeads.load(checkpoint).state_dict())
    optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", weights_only=True))
    say(f"[medusa] resuming after epoch {saved['epoch']} from {checkpoint}")
    return saved["epoch"]


# --- data ------------------------------------------------------------------------------------


def _take(chunks: Iterator[Chunk], num_tokens: int) -> list[Chunk]:
    taken, total = [], 0
    for chunk in chunks:
        room = num_tokens - total
        if room - chunk.start < MIN_CHUNK_TOKENS:  # no room left for a useful chunk
            break
        chunk = Chunk(chunk.ids[:room], chunk.start)  # the last one is cut
        if len(chunk.ids) - chunk.start >= MIN_CHUNK_TOKENS:
            taken.append(chunk)
            total += len(chunk.ids)
    return taken


def _source_files(seed: int) -> Iterator[tuple[str, Path]]:
    """(module name, path) of the installed Python sources, in a seeded order that mixes
    packages (a hash of the path relative to its root, so the same on any machine)."""
    roots = sorted({Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "purelib", "platlib")})
    seen, files = set(), []
    for root in roots:
        for path in root.rglob("*.py"):
            real = path.resolve()
            if real in seen:
                continue
            seen.add(real)
            rel = path.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p not in ("site-packages", "dist-packages", "__init__")]
            files.append((_digest(f"{seed}:{rel.as_posix()}".encode()), ".".join(parts), path))
    for _, name, path in sorted(files):
        yield name, path


def _source_chunks(tokenizer: Any, cfg: TrainConfig, chat: bool) -> Iterator[Chunk]:
    # A window of each file, starting at a seeded line: file heads (licences, imports) would
    # otherwise be over-represented.
    window_chars = cfg.chunk_tokens * 6  # code runs 3-4 characters a token: enough text for a chunk
    for name, path in _source_files(cfg.seed):
        try:
            if not 2_000 <= path.stat().st_size <= 1_000_000:
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        lines = text.splitlines(keepends=True)
        starts, remaining = 0, len(text)  # lines from which a whole window of text follows
        for line in lines:
            if remaining < window_chars:
                break
            starts, remaining = starts + 1, remaining - len(line)
        first = random.Random(f"{cfg.seed}:{name}").randrange(max(starts, 1))
        code = "".join(lines[first:])[:window_chars]
        if chat:
            yield _chat_chunk(tokenizer, f"Write the Python module {name}.", code, cfg.chunk_tokens)
        else:
            yield Chunk(tuple(tokenizer(code).input_ids[: cfg.chunk_tokens]))


def _chat_chunk(tokenizer: Any, request: str, answer: str, length: int) -> Chunk:
    user = [{"role": "user", "content": request}]
    prompt = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template([*user, {"role": "assistant", "content": answer}], tokenize=False)
    ids = tokenizer(full, add_special_tokens=False).input_ids[:length]
    prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    start = 0  # where the answer starts: the shared prefix of the two encodings
    while start < min(len(ids), len(prompt_ids)) and ids[start] == prompt_ids[start]:
        start += 1
    return Chunk(tuple(ids), start)


def _text_chunks(tokenizer: Any, cfg: TrainConfig, paths: list[Path]) -> Iterator[Chunk]:
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"train_medusa: data file {path} not found")
        for text in _documents(path):
            ids = tokenizer(text).input_ids
            for i in range(0, len(ids), cfg.chunk_tokens):
                yield Chunk(tuple(ids[i: i + cfg.chunk_tokens]))


def _documents(path: Path) -> Iterator[str]:
    if path.suffix != ".jsonl":
        yield path.read_text(encoding="utf-8")
        return
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"train_medusa: {path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f'train_medusa: {path}:{n}: expected an object {{"text": "..."}}')
            yield record["text"]


# --- helpers ---------------------------------------------------------------------------------


def _commonest(labels: Tensor, n: int) -> Tensor:
    """The ``n`` most frequent ids among ``labels >= 0``, commonest first (ties: lower id)."""
    labels = labels[labels >= 0].long()
    counts = torch.bincount(labels)
    ids = torch.nonzero(counts).flatten()
    order = torch.argsort(-counts[ids], stable=True)  # ids ascend, so ties keep the lower id first
    return ids[order][:n]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _cache_key(model: nn.Module, chunks: Sequence[Chunk]) -> tuple[str, str]:
    """A digest of the model and the chunks, and a readable file name stem."""
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
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name or name)
    return h.hexdigest(), f"{stem}-{str(embedding.dtype).removeprefix('torch.')}"


def _features_digest(features: Features) -> str:
    return _digest(features.labels.numpy().tobytes() + features.offsets.numpy().tobytes())


def _report(heads: MedusaHeads) -> str:
    m = heads.metrics or {}
    lines = [f"[medusa] held-out accuracy ({m.get('heldout_positions')} positions; "
             f"{m.get('heldout_in_vocab', 0):.1%} of the targets in the heads' {m.get('vocab_size')} ids):",
             "head  predicts  top-1   top-5"]
    for k, (top1, top5) in enumerate(zip(m["top1"], m["top5"]), 1):
        lines.append(f"{k:4d}  t+{k + 1:<7d} {top1:.3f}   {top5:.3f}")
    lines.append(f"per-rank accuracy [K, {RANKS}] (P(rank-r candidate is the target's token)):")
    for k, row in enumerate(heads.rank_accuracy.tolist(), 1):
        lines.append(f"{k:4d}  " + " ".join(f"{p:.3f}" for p in row))
    feature_s = m.get("feature_seconds")
    lines.append(f"[medusa] features {'cached' if feature_s is None else f'{feature_s:.0f} s'}, "
                 f"training {m.get('train_seconds', 0):.0f} s, total {m.get('total_seconds', 0):.0f} s")
    return "\n".join(lines)


class _Reporter:
    """Prints progress lines when verbose."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose

    def __call__(self, message: str) -> None:
        if self.verbose:
            print(message, flush=True)


def cached_heads(model: nn.Module, tokenizer: Any, name: str,
                 cache_dir: str | os.PathLike[str] | None = None, **train_kwargs: Any) -> MedusaHeads:
    """Medusa heads for ``model`` kept under ``<specdec cache>/medusa-heads/<name>``: loaded when
    there, trained there on first use with :func:`train_medusa` (``train_kwargs``) otherwise.
    ``name`` identifies the model and its dtype (e.g. ``"qwen2.5-coder-1.5b-float32"``).

    Heads are not shipped: ours keep only the residual blocks, yet a 1536-wide model's three
    blocks take 28 MB, past what belongs in a package; training says up front how long it will
    take (the feature extraction's projection) and takes about 6 minutes for
    Qwen2.5-Coder-1.5B on the 2-core development CPU (docs/benchmarks.md).
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / "medusa-heads" / re.sub(r"[^\w.-]", "_", name)
    if (path / "config.json").is_file():
        return MedusaHeads.load(path).attach(model)
    print(f"[medusa] no heads cached for {name}: training them once, into {path}", file=sys.stderr)
    return train_medusa(model, tokenizer, path, cache_dir=cache_dir, **train_kwargs)
