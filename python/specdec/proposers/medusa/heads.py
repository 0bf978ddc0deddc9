"""Medusa-1 heads: extra next-next-token predictors on the final hidden state of a frozen target.

Head k (k = 1..K, stored at index k - 1) reads the target's final hidden state ``h_t`` (after the
final norm: the LM head's input) at position t and scores the token at position ``t + k + 1``;
the target's own LM head scores ``t + 1``, so head 1 guesses the token after next. Each head is
``num_layers`` residual blocks ``x + SiLU(W x + b)`` (``W`` and ``b`` zero-initialised, so a fresh
head passes ``h_t`` through unchanged) followed by an output layer.

Two output layers:

- ours (``specdec.train_medusa``): the target's OWN LM head, frozen and shared by every head,
  restricted to ``vocab_ids`` (the most frequent token ids of the training data). It is not in
  our files: :meth:`MedusaHeads.attach` copies those rows from the target (``Vh x H``: 32768 of
  Qwen2.5-1.5B's 151936 rows are 200 MB in float32, and a smaller GEMM per step).
- FasterDecoding/Medusa's checkpoints: a full-vocabulary output layer per head (``[K, V, H]``),
  ``vocab_ids = arange(V)``.

Files: :meth:`MedusaHeads.save` writes ``config.json`` (format marker, sizes, target name,
training metrics and the per-rank accuracy table) and ``heads.safetensors`` (blocks and
``vocab_ids``). :meth:`MedusaHeads.load` reads those, or a FasterDecoding/Medusa directory
(``config.json`` with ``medusa_num_heads``/``medusa_num_layers`` and ``medusa_lm_head.safetensors``
or ``medusa_lm_head.pt``, keys ``{i}.{j}.linear.weight/bias`` for block j of head i and
``{i}.{num_layers}.weight`` for head i's output layer). Nothing is unpickled: ``.pt`` files are
read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import warnings
import weakref
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdec.proposers.files import write_atomically
from specdec.proposers.vocab import check_vocab_ids, head_rows

__all__ = ["FORMAT", "RANKS", "MedusaConfig", "MedusaHeads", "ResBlock"]

FORMAT = "specdec-medusa-heads"
FORMAT_VERSION = 1
RANKS = 10  # columns of the per-rank accuracy table
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "heads.safetensors"
THEIR_WEIGHTS = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


@dataclass(frozen=True)
class MedusaConfig:
    """Sizes of a set of heads, and what they were trained for.

    ``target_vocab_size`` is the target's number of LM head rows (its logits' width);
    ``vocab_size`` the number of ids the heads score (``len(vocab_ids)``). ``per_head_output``:
    each head has its own full-vocabulary output layer (FasterDecoding/Medusa's checkpoints)
    instead of sharing the target's LM head. ``target``: the model's name or path, if known.
    """

    hidden_size: int
    num_heads: int
    num_layers: int
    target_vocab_size: int
    vocab_size: int
    per_head_output: bool = False
    target: str | None = None

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_heads", "target_vocab_size", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"MedusaConfig: {name} must be >= 1, got {getattr(self, name)}")
        # With the target's own head and no block, a head would score t + 1 like the target does.
        if self.num_layers < (0 if self.per_head_output else 1):
            raise ValueError(f"MedusaConfig: num_layers must be >= 1 with the shared LM head, got {self.num_layers}")
        if self.vocab_size > self.target_vocab_size:
            raise ValueError(f"MedusaConfig: vocab_size {self.vocab_size} > target_vocab_size {self.target_vocab_size}")


class ResBlock(nn.Module):
    """``x + SiLU(W x + b)``, zero-initialised: the identity until trained."""

    def __init__(self, hidden_size: int, dtype: torch.dtype | None = None, device: Any = None) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size, dtype=dtype, device=device)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)  # FasterDecoding/Medusa keeps a random bias: not the identity

    def forward(self, x: Tensor) -> Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K Medusa heads over a target's final hidden states; all heads' logits come from one GEMM.

    ``forward(hidden [..., H]) -> logits [..., K, Vh]`` (column c scores target id
    ``vocab_ids[c]``); :meth:`topk` gives each head's best candidates as target ids.
    ``rank_accuracy`` (``[K, RANKS]`` float or None) is the training's held-out table:
    entry ``[k, r]`` is the chance that head k + 1's rank-r candidate is the target's token;
    ``metrics`` the rest of the training's report.

    Example (fresh heads on a tiny model):
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
        >>> target = LlamaForCausalLM(cfg).eval()
        >>> heads = MedusaHeads.for_target(target, num_heads=3, vocab_ids=torch.arange(48))
        >>> hidden = target.model(torch.tensor([[1, 5, 7]])).last_hidden_state  # [1, 3, 32]
        >>> heads(hidden).shape
        torch.Size([1, 3, 3, 48])
        >>> ids, logprobs = heads.topk(hidden[:, -1], k=4)
        >>> ids.shape, logprobs.shape
        (torch.Size([1, 3, 4]), torch.Size([1, 3, 4]))

        Untrained blocks are the identity, so each head scores like the target's LM head:

        >>> torch.allclose(heads(hidden)[:, :, 1], target.lm_head(hidden)[..., :48], atol=1e-6)
        True
    """

    def __init__(
        self, config: MedusaConfig, vocab_ids: Tensor | None = None, *,
        dtype: torch.dtype | None = None, device: Any = None,
    ) -> None:
        super().__init__()
        self.config = config
        size = config.hidden_size
        self.heads = nn.ModuleList(
            nn.Sequential(*(ResBlock(size, dtype, device) for _ in range(config.num_layers)))
            for _ in range(config.num_heads)
        )
        if vocab_ids is None:
            if not config.per_head_output:
                raise ValueError("MedusaHeads: heads on the target's LM head need vocab_ids")
            vocab_ids = torch.arange(config.target_vocab_size)
        vocab_ids = torch.as_tensor(vocab_ids, device=device).long()
        check_vocab_ids(vocab_ids, config.target_vocab_size, "MedusaHeads")
        if len(vocab_ids) != config.vocab_size:
            raise ValueError(f"MedusaHeads: {len(vocab_ids)} vocab_ids for vocab_size {config.vocab_size}")
        self.register_buffer("vocab_ids", vocab_ids)
        if config.per_head_output:
            self.head_weight = nn.Parameter(torch.zeros(
                config.num_heads, config.vocab_size, size, dtype=dtype, device=device))
        else:
            self.head_weight = None
            # The target's LM head rows, attached from the target: never saved with the heads.
            self.register_buffer("shared_weight", None, persistent=False)
            self.register_buffer("shared_bias", None, persistent=False)
        self.rank_accuracy: Tensor | None = None
        self.metrics: dict[str, Any] | None = None
        self._attached: weakref.ref | None = None

    @classmethod
    def for_target(
        cls, model: nn.Module, num_heads: int, vocab_ids: Tensor, num_layers: int = 1,
        dtype: torch.dtype = torch.float32,
    ) -> MedusaHeads:
        """Fresh (untrained) heads for ``model`` over its LM head's rows ``vocab_ids``, attached."""
        lm_head = _lm_head(model)
        vocab_ids = torch.as_tensor(vocab_ids).long()
        config = MedusaConfig(
            hidden_size=lm_head.in_features, num_heads=num_heads, num_layers=num_layers,
            target_vocab_size=lm_head.out_features, vocab_size=len(vocab_ids),
            target=_model_name(model),
        )
        device = next(model.parameters()).device
        return cls(config, vocab_ids, dtype=dtype, device=device).attach(model)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def forward(self, hidden: Tensor) -> Tensor:
        """Logits ``[..., K, Vh]`` of every head from final hidden states ``[..., H]``."""
        if hidden.shape[-1] != self.config.hidden_size:
            raise ValueError(f"MedusaHeads: hidden states of size {hidden.shape[-1]}, the heads "
                             f"take {self.config.hidden_size}")
        x = hidden.to(self.dtype)
        features = torch.stack([head(x) for head in self.heads], dim=-2)  # [..., K, H]
        if self.head_weight is not None:
            return torch.einsum("...kh,kvh->...kv", features, self.head_weight)
        if self.shared_weight is None:
            raise RuntimeError("MedusaHeads: no output layer yet: call heads.attach(target) first")
        return F.linear(features, self.shared_weight, self.shared_bias)

    def topk(self, hidden: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Each head's ``k`` best candidates from hidden states ``[B, H]``: target token ids
        ``[B, K, k]`` (int64) and their log-probabilities ``[B, K, k]`` (float32, log-softmax
        over the head's ``Vh`` ids), best first."""
        if not 1 <= k <= self.config.vocab_size:
            raise ValueError(f"MedusaHeads.topk: k must be in 1..{self.config.vocab_size}, got {k}")
        logprobs = torch.log_softmax(self(hidden).float(), dim=-1)
        top, index = logprobs.topk(k, dim=-1)
        return self.vocab_ids[index], top

    def check(self, target: nn.Module) -> None:
        """Raise ValueError unless ``target`` has the hidden size and vocabulary the heads were
        made for."""
        lm_head = _lm_head(target)
        cfg = self.config
        made_for = f" ({cfg.target})" if cfg.target else ""
        if lm_head.in_features != cfg.hidden_size:
            raise ValueError(f"MedusaHeads: made for a model{made_for} with hidden size {cfg.hidden_size}; "
                             f"this target's is {lm_head.in_features}: heads trained for another model")
        if lm_head.out_features != cfg.target_vocab_size:
            raise ValueError(f"MedusaHeads: made for a model{made_for} with {cfg.target_vocab_size} token "
                             f"ids; this target scores {lm_head.out_features}: heads trained for another model")

    def attach(self, target: nn.Module) -> MedusaHeads:
        """Check ``target`` and take its LM head's rows ``vocab_ids`` as the shared output layer
        (a copy, in the heads' dtype and device). Idempotent: a second call with the same LM head
        module does nothing. Works on a target prepared by ``specdec.pack_linear_layers``.
        Returns ``self``."""
        self.check(target)
        lm_head = _lm_head(target)
        if self.head_weight is not None or (self._attached is not None and self._attached() is lm_head):
            return self
        with torch.no_grad():
            weight, bias = head_rows(lm_head, self.vocab_ids)
            self.shared_weight = weight.to(self.vocab_ids.device, self.dtype)
            self.shared_bias = None if bias is None else bias.to(self.vocab_ids.device, self.dtype)
        self._attached = weakref.ref(lm_head)
        return self

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``config.json`` and ``heads.safetensors`` into ``directory`` (created if needed;
        each file is written under a temporary name, then renamed). Returns the directory.

        Example:
            >>> import tempfile
            >>> cfg = MedusaConfig(hidden_size=8, num_heads=2, num_layers=1,
            ...                    target_vocab_size=20, vocab_size=5)
            >>> heads = MedusaHeads(cfg, vocab_ids=torch.tensor([3, 1, 4, 9, 2]))
            >>> with tempfile.TemporaryDirectory() as d:
            ...     again = MedusaHeads.load(heads.save(d))
            >>> again.config == cfg, again.vocab_ids.tolist()
            (True, [3, 1, 4, 9, 2])
        """
        from safetensors.torch import save_file

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        meta: dict[str, Any] = {"format": FORMAT, "format_version": FORMAT_VERSION, **asdict(self.config)}
        if self.rank_accuracy is not None:
            meta["rank_accuracy"] = self.rank_accuracy.tolist()
        if self.metrics is not None:
            meta["metrics"] = self.metrics
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        write_atomically(out / WEIGHTS_FILE, lambda tmp: save_file(state, str(tmp)))
        write_atomically(out / CONFIG_FILE, lambda tmp: tmp.write_text(json.dumps(meta, indent=2) + "\n"))
        return out

    @classmethod
    def load(cls, directory: str | os.PathLike[str], dtype: torch.dtype | None = None) -> MedusaHeads:
        """Heads from a directory written by :meth:`save` or a FasterDecoding/Medusa checkpoint
        directory, in their stored dtype unless ``dtype`` is given. Ours must be attached to the
        target (:meth:`attach`) before use; theirs carry their own output layers.

        A FasterDecoding/Medusa file may hold more heads than its config's ``medusa_num_heads``
        (their loader overrides the uploaded configs with 5): every head in the file is loaded.
        """
        path = Path(directory)
        if not path.is_dir():
            raise FileNotFoundError(f"MedusaHeads.load: {path} is not a directory")
        config_path = path / CONFIG_FILE
        if not config_path.is_file():
            raise FileNotFoundError(f"MedusaHeads.load: no {CONFIG_FILE} in {path}")
        meta = json.loads(config_path.read_text())
        if meta.get("format") == FORMAT:
            heads = _load_ours(path, meta)
        elif "medusa_num_heads" in meta:
            heads = _load_theirs(path, meta)
        else:
            raise ValueError(f"MedusaHeads.load: unknown layout in {config_path}: neither format "
                             f"{FORMAT!r} nor FasterDecoding/Medusa's (medusa_num_heads)")
        return heads if dtype is None else heads.to(dtype)

    def extra_repr(self) -> str:
        c = self.config
        output = "own output layers" if c.per_head_output else "the target's LM head"
        return (f"num_heads={c.num_heads}, num_layers={c.num_layers}, hidden_size={c.hidden_size}, "
                f"vocab_size={c.vocab_size}/{c.target_vocab_size} ({output})")


def _lm_head(model: nn.Module) -> nn.Module:
    lm_head = model.get_output_embeddings()
    if lm_head is None or not hasattr(lm_head, "in_features"):
        raise ValueError(f"MedusaHeads: the target needs a linear LM head, not {type(lm_head).__name__}")
    return lm_head


def _model_name(model: nn.Module) -> str | None:
    return getattr(getattr(model, "config", None), "name_or_path", None) or None


def _load_ours(path: Path, meta: dict[str, Any]) -> MedusaHeads:
    from safetensors.torch import load_file

    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"MedusaHeads.load: {path} has format version {meta.get('format_version')}; "
                         f"this specdec reads version {FORMAT_VERSION}")
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"MedusaHeads.load: no {WEIGHTS_FILE} in {path}")
    state = load_file(str(weights))
    config = MedusaConfig(**{f.name: meta[f.name] for f in fields(MedusaConfig) if f.name in meta})
    dtype = next(v.dtype for v in state.values() if v.is_floating_point())
    heads = MedusaHeads(config, state.get("vocab_ids"), dtype=dtype)
    try:
        heads.load_state_dict(state)
    except RuntimeError as e:
        raise ValueError(f"MedusaHeads.load: {weights} does not match its {CONFIG_FILE}: {e}") from None
    if meta.get("rank_accuracy") is not None:
        heads.rank_accuracy = torch.tensor(meta["rank_accuracy"], dtype=torch.float32)
    heads.metrics = meta.get("metrics")
    return heads


def _load_theirs(path: Path, meta: dict[str, Any]) -> MedusaHeads:
    files = [path / name for name in THEIR_WEIGHTS if (path / name).is_file()]
    if not files:
        raise FileNotFoundError(f"MedusaHeads.load: {path} has a FasterDecoding/Medusa config but "
                                f"neither {' nor '.join(THEIR_WEIGHTS)}")
    if files[0].suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(files[0]))
    else:
        state = torch.load(files[0], map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            raise ValueError(f"MedusaHeads.load: {files[0]} is not a state dict of tensors")
    layers = int(meta.get("medusa_num_layers", 1))
    found = sum(1 for i in range(len(state)) if f"{i}.{layers}.weight" in state)
    declared = int(meta["medusa_num_heads"])
    if found < declared or found == 0:
        raise ValueError(f"MedusaHeads.load: {files[0]} holds output layers ({{i}}.{layers}.weight) for "
                         f"{found} heads; {CONFIG_FILE} declares {declared} with {layers} layers")
    if found > declared:
        warnings.warn(f"MedusaHeads.load: {files[0]} holds {found} heads, {CONFIG_FILE} declares "
                      f"{declared}: loading all {found}", stacklevel=3)
    vocab, hidden = state[f"0.{layers}.weight"].shape
    if meta.get("hidden_size", hidden) != hidden:
        raise ValueError(f"MedusaHeads.load: {CONFIG_FILE} says hidden_size {meta['hidden_size']}, "
                         f"the weights have {hidden}")
    config = MedusaConfig(hidden_size=hidden, num_heads=found, num_layers=layers, target_vocab_size=vocab,
                          vocab_size=vocab, per_head_output=True, target=meta.get("base_model_name_or_path"))
    ours = {f"heads.{i}.{j}.linear.{p}": f"{i}.{j}.linear.{p}"
            for i in range(found) for j in range(layers) for p in ("weight", "bias")}
    outputs = [f"{i}.{layers}.weight" for i in range(found)]
    missing = [k for k in [*ours.values(), *outputs] if k not in state]
    unknown = sorted(set(state) - set(ours.values()) - set(outputs))
    if missing or unknown:
        raise ValueError(f"MedusaHeads.load: unknown layout in {files[0]}: missing keys {missing[:4]}, "
                         f"unexpected keys {unknown[:4]}")
    dtype = state[outputs[0]].dtype
    heads = MedusaHeads(config, dtype=dtype)
    try:
        heads.load_state_dict({
            **{ours_key: state[key] for ours_key, key in ours.items()},
            "vocab_ids": heads.vocab_ids,
            "head_weight": torch.stack([state[key] for key in outputs]),
        })
    except RuntimeError as e:
        raise ValueError(f"MedusaHeads.load: unknown layout in {files[0]}: {e}") from None
    return heads
