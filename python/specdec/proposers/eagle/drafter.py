"""The EAGLE drafter: one decoder layer that predicts the target's next final hidden state from
its current one and the next token, scored by the target's own LM head.

EAGLE-1's feature-level drafting (Li et al., 2024): at position t the drafter reads the target's
final hidden state ``f_t`` (after the final norm: the LM head's input) and the embedding of the
token that follows, ``x_{t+1}``, and predicts ``f_{t+1}``::

    f_{t+1} ≈ layer(fc([embed(x_{t+1}) ; f_t]))        logits(x_{t+2}) = lm_head(f_{t+1})

``fc`` is a ``2H -> H`` linear map without bias; ``layer`` one decoder layer of the target's own
architecture (initialised from the target's last layer) whose input norm is left out, as in
EAGLE and vLLM's ``EagleLlamaForCausalLM``; no final norm. ``embed`` and ``lm_head`` are the
target's, frozen and never saved with the drafter. Deeper in a step the drafter feeds its own
predicted features back in. The layer keeps a KV cache of its own (a `SpecCache` of one layer),
so the drafter sees the whole context through its attention.

The LM head scores only the drafter's ``vocab_ids`` (``draft_vocab_size`` of the target's ids,
as EAGLE-3's ``d2t`` map: `specdec.train_eagle` takes the training labels' commonest ids): a
smaller GEMM per draft token, and a softmax over the ids that matter, which a small training
budget learns faster. The ids are kept in ascending order, the target's, so a draw over them
with the target's uniform stays coupled to the target's draw (sampling). A drafter made without
``vocab_ids`` scores ids ``0 .. draft_vocab_size - 1`` (byte-level BPE vocabularies number
tokens roughly commonest first).

Files: :meth:`EagleDrafter.save` writes ``config.json`` (format marker, sizes, the layer's
transformers config, the training's metrics) and ``drafter.safetensors`` (``fc.weight`` and
``layers.0.*``, the names vLLM's EAGLE models load, and ``vocab_ids``; ``specdec export-vllm
--eagle`` adds what vLLM's loader needs).
"""

from __future__ import annotations

import json
import os
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from specdec.model.linear_layers import PackedLinear, dense_weight
from specdec.model.prepare import PackingConfig, dot_kernel_pays, pack_linear_layers
from specdec.proposers.vocab import check_vocab_ids, head_for_ids
from specdec.proposers.eagle.files import CONFIG_FILE, FORMAT, FORMAT_VERSION, WEIGHTS_FILE, read_saved
from specdec.proposers.files import write_atomically

__all__ = ["FORMAT", "EagleConfig", "EagleDrafter"]

# The layer's projections back into the residual stream (Llama, Qwen2, Mistral and kin), zeroed
# in a fresh drafter.
OUTPUT_PROJECTIONS = ("self_attn.o_proj", "mlp.down_proj")


@dataclass(frozen=True)
class EagleConfig:
    """Sizes of a drafter and what it was made for.

    ``layer_config``: the target's transformers config as a dict (its architecture, attention
    and MLP sizes, rotary settings), from which the drafter's one layer is built.
    ``target_vocab_size``: the target's LM head rows; ``draft_vocab_size``: how many of its ids
    the drafter scores (its ``vocab_ids``). ``target``: the target's name or path, if known."""

    hidden_size: int
    target_vocab_size: int
    draft_vocab_size: int
    layer_config: dict[str, Any] = field(repr=False)
    target: str | None = None

    def __post_init__(self) -> None:
        for name in ("hidden_size", "target_vocab_size", "draft_vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"EagleConfig: {name} must be >= 1, got {getattr(self, name)}")
        if self.draft_vocab_size > self.target_vocab_size:
            raise ValueError(f"EagleConfig: draft_vocab_size {self.draft_vocab_size} > target_vocab_size "
                             f"{self.target_vocab_size}")

    def transformers_config(self) -> PretrainedConfig:
        """The config of the drafter's one-layer model (no vocabulary of its own: the target's
        embedding and LM head are used)."""
        values = dict(self.layer_config)
        model_type = values.pop("model_type")
        # Special token ids: the unused one-row vocabulary holds none of the target's.
        values.update(num_hidden_layers=1, vocab_size=1, tie_word_embeddings=False, bos_token_id=None,
                      eos_token_id=None, pad_token_id=None)
        values.pop("layer_types", None)  # per-layer lists describe the target's layers
        return AutoConfig.for_model(model_type, **values)


class EagleDrafter(nn.Module):
    """An EAGLE drafter for one target (see the module's docstring).

    ``forward(input_ids [B, T], features [B, T, H]) -> [B, T, H]``: the predicted next features
    for each pair ``(x_{t+1}, f_t)``, causal over the T positions (training; decoding runs the
    same layer on its KV cache through `specdec.Eagle`). :meth:`logits` scores features over
    the drafter's vocabulary: column c is the target's id ``vocab_ids[c]`` (ascending; default
    ids ``0 .. draft_vocab_size - 1``); :meth:`columns` maps ids back.

    Example (a fresh drafter for a tiny model):
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        >>> target = LlamaForCausalLM(cfg).eval()
        >>> drafter = EagleDrafter.for_target(target, vocab_ids=torch.tensor([9, 1, 5, 7]))
        >>> out = target.model(torch.tensor([[1, 5, 7, 9]]))
        >>> features = out.last_hidden_state[:, :-1]             # f_0, f_1, f_2
        >>> predicted = drafter(torch.tensor([[5, 7, 9]]), features)  # f_1, f_2, f_3 predicted
        >>> predicted.shape, drafter.logits(predicted).shape
        (torch.Size([1, 3, 32]), torch.Size([1, 3, 4]))
        >>> drafter.vocab_ids.tolist(), drafter.columns(torch.tensor([7, 8, -1])).tolist()
        ([1, 5, 7, 9], [2, -1, -1])
    """

    def __init__(self, config: EagleConfig, vocab_ids: Tensor | None = None, *, dtype: torch.dtype = torch.float32,
                 device: Any = None) -> None:
        super().__init__()
        self.config = config
        if vocab_ids is None:
            vocab_ids = torch.arange(config.draft_vocab_size)
        vocab_ids = torch.as_tensor(vocab_ids).long().flatten().sort().values
        if len(vocab_ids) != config.draft_vocab_size:
            raise ValueError(f"EagleDrafter: {len(vocab_ids)} vocab_ids for draft_vocab_size {config.draft_vocab_size}")
        check_vocab_ids(vocab_ids, config.target_vocab_size, "EagleDrafter")
        self.register_buffer("vocab_ids", vocab_ids.to(device), persistent=False)
        H = config.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=False, dtype=dtype, device=device)
        layer_config = config.transformers_config()
        layer_config._attn_implementation = "sdpa"
        # A causal LM of one layer: the loop's passes (tree attention, KV cache) run it as they
        # run any model. Its own one-row embedding and LM head are never used.
        self.model = AutoModelForCausalLM.from_config(layer_config, dtype=dtype).to(device)
        self.model.requires_grad_(False)
        decoder = self.model.get_decoder()
        decoder.layers[0].input_layernorm = nn.Identity()
        decoder.norm = nn.Identity()
        decoder.layers.requires_grad_(True)
        self.rank_accuracy: Tensor | None = None   # [depth, ranks] held-out, from training
        self.metrics: dict[str, Any] | None = None
        self._target: _Attached | None = None

    @classmethod
    def for_target(cls, model: nn.Module, draft_vocab_size: int = 32_768,
                   dtype: torch.dtype = torch.float32, vocab_ids: Tensor | None = None) -> EagleDrafter:
        """A fresh drafter for ``model``, attached, scoring ``vocab_ids`` (default: ids ``0 ..
        draft_vocab_size - 1``; given, they set the size): its layer a copy of the target's last
        decoder layer (the input norm left out; a layer prepared by `specdec.pack_linear_layers` is
        unpacked) with its output projections (``self_attn.o_proj``, ``mlp.down_proj``) zeroed,
        and ``fc`` adding the token's embedding to the feature. So a fresh drafter predicts
        ``f_t + embed(x_{t+1})``, at the features' scale, and training teaches attention and MLP
        corrections to it: the target's layer as copied writes updates at the scale of the
        target's residual stream, which its final norm brings back to the features' and the
        drafter has no such norm (docs/benchmarks.md, "EAGLE and Medusa", has what training
        from the copy as it is gave)."""
        lm_head = model.get_output_embeddings()
        values = model.config.to_dict()
        size = len(vocab_ids) if vocab_ids is not None else min(draft_vocab_size, lm_head.out_features)
        config = EagleConfig(hidden_size=model.config.hidden_size, target_vocab_size=lm_head.out_features,
                             draft_vocab_size=size, layer_config=values,
                             target=getattr(model.config, "name_or_path", None) or None)
        device = next(model.parameters()).device
        drafter = cls(config, vocab_ids, dtype=dtype, device=device)
        last = model.get_decoder().layers[-1]
        with torch.no_grad():
            for name, value in drafter.layer.state_dict().items():
                source = _dense(last, name)
                if source is not None and source.shape == value.shape:
                    value.copy_(source)
            for name in OUTPUT_PROJECTIONS:
                try:
                    drafter.layer.get_submodule(name).weight.zero_()
                except AttributeError:  # another layout: left as copied
                    pass
            H = config.hidden_size
            eye = torch.eye(H, dtype=dtype, device=device)
            drafter.fc.weight.copy_(torch.cat([eye, eye], 1))
        return drafter.attach(model)

    @property
    def layer(self) -> nn.Module:
        """The drafter's decoder layer."""
        return self.model.get_decoder().layers[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def check(self, target: nn.Module) -> None:
        """Raise ValueError unless ``target`` has the hidden size and vocabulary the drafter was
        made for."""
        cfg = self.config
        lm_head = target.get_output_embeddings()
        made_for = f" ({cfg.target})" if cfg.target else ""
        hidden = getattr(lm_head, "in_features", None)
        if hidden != cfg.hidden_size:
            raise ValueError(f"EagleDrafter: made for a model{made_for} with hidden size {cfg.hidden_size}; "
                             f"this target's is {hidden}: a drafter trained for another model")
        if lm_head.out_features != cfg.target_vocab_size:
            raise ValueError(f"EagleDrafter: made for a model{made_for} with {cfg.target_vocab_size} token ids; "
                             f"this target scores {lm_head.out_features}: a drafter trained for another model")

    def attach(self, target: nn.Module) -> EagleDrafter:
        """Check ``target`` and take its embedding (shared) and its LM head's rows
        ``vocab_ids`` (a copy, packed like the target's when it is prepared by
        `specdec.pack_linear_layers`). Idempotent for the same LM head. Returns ``self``."""
        self.check(target)
        lm_head = target.get_output_embeddings()
        if self._target is not None and self._target.lm_head() is lm_head:
            return self
        with torch.no_grad():
            head = head_for_ids(lm_head, self.vocab_ids).requires_grad_(False)
        self._target = _Attached(target.get_input_embeddings(), head, dense_weight(lm_head).dtype,
                                 weakref.ref(lm_head))
        return self

    def prepare(self) -> EagleDrafter:
        """Run the drafter's linear layers (``fc``, its layer's projections) on specdec's kernel
        (`specdec.model.linear_layers.DotLinear`: the same weights, no copy, the state and the
        saved file unchanged) where that kernel is built for this CPU
        (`specdec.model.prepare.dot_kernel_pays`) and the drafter is on it; elsewhere nothing
        changes. A drafting step multiplies a few tree nodes per level, where torch's products
        cost several times specdec's (docs/benchmarks.md). Inference only afterwards: no
        gradients flow through the kernel. `specdec.Eagle` calls it on a target prepared by
        `specdec.pack_linear_layers`. Returns ``self``.

        Example:
            >>> from transformers import LlamaConfig, LlamaForCausalLM
            >>> target = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
            ...                                       num_hidden_layers=1, num_attention_heads=4)).eval()
            >>> drafter = EagleDrafter.for_target(target)
            >>> x, f, names = torch.tensor([[5, 7]]), torch.randn(1, 2, 32), sorted(drafter.weights())
            >>> with torch.no_grad():
            ...     before = drafter(x, f)
            ...     after = drafter.prepare()(x, f)
            >>> torch.allclose(before, after, atol=1e-5), sorted(drafter.weights()) == names
            (True, True)
        """
        if dot_kernel_pays() and self.fc.weight.device.type == "cpu":
            pack_linear_layers(self, PackingConfig(kernel="specdec"))
        return self

    def inputs(self, input_ids: Tensor, features: Tensor) -> Tensor:
        """The layer's input ``fc([embed(x) ; f])`` ``[..., H]`` for tokens ``[...]`` and
        features ``[..., H]``."""
        if features.shape[-1] != self.config.hidden_size:
            raise ValueError(f"EagleDrafter: features of size {features.shape[-1]}, the drafter takes "
                             f"{self.config.hidden_size}")
        embedded = self._attached().embedding(input_ids).to(self.dtype)
        return self.fc(torch.cat([embedded, features.to(self.dtype)], -1))

    def forward(self, input_ids: Tensor, features: Tensor, position_ids: Tensor | None = None) -> Tensor:
        decoder = self.model.get_decoder()
        return decoder(inputs_embeds=self.inputs(input_ids, features), position_ids=position_ids,
                       use_cache=False).last_hidden_state

    def logits(self, features: Tensor) -> Tensor:
        """``[..., draft_vocab_size]`` scores of the ids ``vocab_ids`` (in the target's dtype: its
        LM head's rows)."""
        attached = self._attached()
        return attached.head(features.to(attached.head_dtype))

    def columns(self, ids: Tensor) -> Tensor:
        """The column of :meth:`logits` that scores each of the target's ``ids`` (any shape), -1
        for ids outside ``vocab_ids`` and for negative ones."""
        ids = ids.to(self.vocab_ids.device).contiguous()  # searchsorted copies (and warns) otherwise
        at = torch.searchsorted(self.vocab_ids, ids).clamp_max(len(self.vocab_ids) - 1)
        return torch.where(self.vocab_ids[at] == ids, at, -1)  # a negative id matches no vocab id

    def weights(self) -> dict[str, Tensor]:
        """The trained weights under the names of the saved file (and of vLLM's EAGLE models)."""
        state = {f"fc.{k}": v for k, v in self.fc.state_dict().items()}
        state.update({f"layers.0.{k}": v for k, v in self.layer.state_dict().items()})
        return state

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``config.json`` and ``drafter.safetensors`` into ``directory`` (created if
        needed; each written under a temporary name, then renamed). Returns the directory."""
        from safetensors.torch import save_file

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        meta: dict[str, Any] = {"format": FORMAT, "format_version": FORMAT_VERSION, **asdict(self.config),
                                "dtype": str(self.dtype).removeprefix("torch.")}
        if self.rank_accuracy is not None:
            meta["rank_accuracy"] = self.rank_accuracy.tolist()
        if self.metrics is not None:
            meta["metrics"] = self.metrics
        state = {k: v.detach().cpu().contiguous() for k, v in self.weights().items()}
        state["vocab_ids"] = self.vocab_ids.cpu()
        write_atomically(out / WEIGHTS_FILE, lambda tmp: save_file(state, str(tmp)))
        write_atomically(out / CONFIG_FILE, lambda tmp: tmp.write_text(json.dumps(meta, indent=2) + "\n"))
        return out

    @classmethod
    def load(cls, directory: str | os.PathLike[str], dtype: torch.dtype | None = None) -> EagleDrafter:
        """A drafter saved by :meth:`save`, in its stored dtype unless ``dtype`` is given; attach
        it to its target (:meth:`attach`; `specdec.Eagle` does) before use."""
        meta, state = read_saved(directory, "EagleDrafter.load")
        config = EagleConfig(**{k: meta[k] for k in ("hidden_size", "target_vocab_size", "draft_vocab_size",
                                                     "layer_config", "target")})
        vocab_ids = state.pop("vocab_ids", None)  # absent: a drafter saved before it had one (the lowest ids)
        drafter = cls(config, vocab_ids, dtype=dtype or getattr(torch, meta.get("dtype", "float32")))
        missing = sorted(set(drafter.weights()) - set(state))
        unknown = sorted(set(state) - set(drafter.weights()))
        if missing or unknown:
            raise ValueError(f"EagleDrafter.load: {directory}'s {WEIGHTS_FILE} does not match its {CONFIG_FILE}: missing "
                             f"{missing[:4]}, unexpected {unknown[:4]}")
        with torch.no_grad():
            drafter.fc.weight.copy_(state["fc.weight"])
            drafter.layer.load_state_dict({k.removeprefix("layers.0."): v for k, v in state.items()
                                           if k.startswith("layers.0.")})
        if meta.get("rank_accuracy") is not None:
            drafter.rank_accuracy = torch.tensor(meta["rank_accuracy"], dtype=torch.float32)
        drafter.metrics = meta.get("metrics")
        return drafter

    def _attached(self) -> _Attached:
        if self._target is None:
            raise RuntimeError("EagleDrafter: call drafter.attach(target) first")
        return self._target

    def extra_repr(self) -> str:
        c = self.config
        return (f"hidden_size={c.hidden_size}, draft_vocab_size={c.draft_vocab_size}/{c.target_vocab_size}, "
                f"layer={type(self.layer).__name__}")


@dataclass(frozen=True)
class _Attached:
    """What the drafter uses of its target (held outside the module's parameters: never saved,
    never moved with the drafter)."""

    embedding: nn.Module
    head: nn.Module  # the LM head's rows vocab_ids (a copy)
    head_dtype: torch.dtype
    lm_head: weakref.ref  # the target's LM head they came from


def _dense(layer: nn.Module, name: str) -> Tensor | None:
    """The tensor ``name`` of a decoder layer's state (``self_attn.q_proj.weight``), unpacked
    from a prepared linear layer; None where the layer has no such tensor."""
    module_name, attr = name.rsplit(".", 1)
    try:
        module = layer.get_submodule(module_name)
    except AttributeError:
        return None
    if attr == "weight" and isinstance(module, PackedLinear):
        return dense_weight(module)
    value = getattr(module, attr, None)
    return value if isinstance(value, Tensor) else None
