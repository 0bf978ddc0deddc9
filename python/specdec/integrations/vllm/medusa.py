"""Medusa heads trained by specdec, written in the checkpoint layout of vLLM's ``medusa`` method.

Ours (``specdec train-medusa``, :class:`specdec.MedusaHeads`): head k is ``num_layers`` residual
blocks ``x + SiLU(W x + b)`` on the target's final hidden state (after the final norm), then the
target's own LM head restricted to ``vocab_ids`` (the commonest ids of the training data).
vLLM 0.32's ``Medusa`` (vllm/model_executor/models/medusa.py) is the same architecture: per head
``num_hidden_layers`` blocks ``x + SiLU(W x + b)`` (the bias when ``medusa_fc_bias``), on the
same hidden state, and with ``original_lm_head`` one LM head shared by all heads, of
``truncated_vocab_size`` rows whose logits land on the target ids ``token_map``. It drafts the
chain of each head's top-1 token, as our head k guesses position t + k + 1. So the export is
exact; what it cannot carry is an LM head bias (vLLM's has none: refused) and our trees (vLLM
verifies one chain). vLLM does not share the target's LM head in memory: the export writes the
``vocab_ids`` rows of it (``Vh x H``) next to the blocks.

Files written: ``config.json`` (vLLM's MedusaConfig fields, and under ``"specdec"`` what the
heads were made for) and ``model.safetensors``: ``blocks.{i}.layers.{j}.weight/bias``,
``lm_heads.0.weight`` (the shared head's rows), ``token_map`` (int64 target ids; only when the
heads score fewer ids than the target). Heads with their own full-vocabulary output layers
(FasterDecoding/Medusa's, loaded by :meth:`MedusaHeads.load`) get ``lm_heads.{i}.weight``.

Example (fresh heads on a tiny model; vLLM is not needed to export)::

    heads = specdec.MedusaHeads.load("heads/")          # from specdec train-medusa
    export_medusa(heads, "heads-vllm/", lm_head=lm_head_weight("path/to/target"))
    LLM(model="path/to/target", **medusa_engine_args("heads-vllm/", "path/to/target"))
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from specdec.integrations.vllm.checkpoint import check_made_for, read_config, write_checkpoint

__all__ = ["export_medusa", "lm_head_weight", "medusa_engine_args"]

FORMAT = "specdec-medusa-vllm"
FORMAT_VERSION = 1


def export_medusa(heads: Any, out_dir: str | os.PathLike[str], lm_head: Tensor | None = None) -> Path:
    """Write ``heads`` (a :class:`specdec.MedusaHeads`) into ``out_dir`` for vLLM's ``medusa``.

    Heads on the target's LM head need its rows: heads attached to the target
    (``heads.attach(model)``) have them, else pass the target's whole LM head weight ``lm_head``
    (``[target_vocab_size, hidden_size]``, e.g. :func:`lm_head_weight`). Returns ``out_dir``.
    """
    cfg = heads.config
    state: dict[str, Tensor] = {}
    for i, head in enumerate(heads.heads):
        for j, block in enumerate(head):
            state[f"blocks.{i}.layers.{j}.weight"] = block.linear.weight
            state[f"blocks.{i}.layers.{j}.bias"] = block.linear.bias
    truncated = cfg.vocab_size
    if cfg.per_head_output:
        # Full-vocabulary layers (their vocab_ids are 0..V-1): one LM head per head, no map.
        state.update({f"lm_heads.{i}.weight": w for i, w in enumerate(heads.head_weight)})
    else:
        rows = _shared_rows(heads, lm_head)
        if truncated == cfg.target_vocab_size:  # every id: the target's order, no map
            state["lm_heads.0.weight"] = rows[torch.argsort(heads.vocab_ids)]
        else:
            state["lm_heads.0.weight"] = rows
            state["token_map"] = heads.vocab_ids.long()
    config = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.target_vocab_size,
        "num_heads": cfg.num_heads,
        "num_hidden_layers": cfg.num_layers,
        "truncated_vocab_size": truncated,
        "original_lm_head": not cfg.per_head_output,
        "medusa_fc_bias": True,
        "specdec": {"format": FORMAT, "format_version": FORMAT_VERSION, "target": cfg.target},
    }
    return write_checkpoint(out_dir, state, config)


def lm_head_weight(model_dir: str | os.PathLike[str]) -> Tensor:
    """The LM head weight ``[vocab, hidden]`` of the Hugging Face model in ``model_dir``, read
    from its safetensors files alone (``lm_head.weight``, or the input embeddings when the two
    are tied), so that exporting heads needs neither the model's code nor transformers."""
    from safetensors import safe_open

    path = Path(model_dir)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"specdec.vllm: no .safetensors file in {path}")
    for key in ("lm_head.weight", "model.embed_tokens.weight", "embed_tokens.weight"):
        for file in files:
            with safe_open(str(file), "pt") as f:
                if key in f.keys():
                    return f.get_tensor(key)
    raise ValueError(f"specdec.vllm: {path} has neither lm_head.weight nor model.embed_tokens.weight")


def medusa_engine_args(heads_dir: str | os.PathLike[str], target: str | os.PathLike[str],
                       num_speculative_tokens: int | None = None) -> dict[str, Any]:
    """vLLM engine arguments (``LLM(model=target, **medusa_engine_args(...))``) that serve heads
    exported by :func:`export_medusa`, after checking that they were made for the model in
    directory ``target`` (hidden size and vocabulary).

    ``speculative_config``: the ``medusa`` method over ``heads_dir``, ``num_speculative_tokens``
    defaulting to the number of heads (each head drafts one token). With a ``token_map`` also
    ``model_loader_extra_config={"enable_weights_track": False}``: vLLM 0.32's Medusa makes the
    map a parameter while loading and does not report it loaded, so the loader's check of loaded
    weights fails on every truncated-vocabulary checkpoint (the map itself loads fine).

    Raises ValueError, naming both sizes, for heads trained for another model.
    """
    heads_cfg = read_config(Path(heads_dir), "exported Medusa heads")
    if heads_cfg.get("model_type") != "medusa":
        raise ValueError(f"specdec.vllm: {heads_dir} holds no Medusa heads for vLLM (model_type "
                         f"{heads_cfg.get('model_type')!r}); write them with export_medusa")
    check_made_for(heads_cfg, target, f"the Medusa heads in {heads_dir} were", "heads")
    heads = int(heads_cfg["num_heads"])
    k = heads if num_speculative_tokens is None else num_speculative_tokens
    if not 1 <= k <= heads:
        raise ValueError(f"specdec.vllm: num_speculative_tokens must be in 1..{heads} (one per head), got {k}")
    args: dict[str, Any] = {"speculative_config": {"method": "medusa", "model": str(heads_dir),
                                                   "num_speculative_tokens": k}}
    if heads_cfg["truncated_vocab_size"] < heads_cfg["vocab_size"]:
        args["model_loader_extra_config"] = {"enable_weights_track": False}
    return args


def _shared_rows(heads: Any, lm_head: Tensor | None) -> Tensor:
    cfg = heads.config
    if heads.shared_bias is not None:
        raise ValueError("specdec.vllm.export_medusa: the target's LM head has a bias; vLLM's Medusa "
                         "LM head has none, so these heads cannot be exported exactly")
    if lm_head is None:
        if heads.shared_weight is None:
            raise ValueError("specdec.vllm.export_medusa: the heads share the target's LM head: attach "
                             "them (heads.attach(model)) or pass lm_head=lm_head_weight(target_dir)")
        return heads.shared_weight
    if tuple(lm_head.shape) != (cfg.target_vocab_size, cfg.hidden_size):
        raise ValueError(f"specdec.vllm.export_medusa: the heads were made for "
                         f"{cfg.target or 'a model'} (LM head {cfg.target_vocab_size} x {cfg.hidden_size}); "
                         f"this LM head is {tuple(lm_head.shape)}: heads trained for another model")
    return lm_head.index_select(0, heads.vocab_ids.to(lm_head.device)).to(heads.dtype)
