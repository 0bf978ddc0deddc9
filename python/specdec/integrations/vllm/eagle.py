"""EAGLE drafters trained by specdec, written in the checkpoint layout of vLLM's ``eagle`` method.

Ours (:class:`specdec.proposers.eagle.drafter.EagleDrafter`, ``specdec train-eagle``): at position
t, ``layer(fc([embed(x_{t+1}) ; f_t]))`` predicts the target's next final hidden state (after its
final norm), ``fc`` a ``2H -> H`` map without bias, ``layer`` one decoder layer of the target's
architecture without its input norm, no final norm, the target's embedding and LM head shared.
vLLM 0.32's ``EagleLlamaForCausalLM`` (vllm/model_executor/models/llama_eagle.py) is the same
model: ``fc`` over ``cat(embed(x), hidden)``, a Llama decoder layer whose ``input_layernorm``
is the identity, ``hidden + residual`` out with no norm, and, when the checkpoint holds no
``embed_tokens``/``lm_head``, the target's own (vLLM shares them in memory). It reads the same
hidden state: the target's output, after the final norm. Positions agree too (the pair
``(x_{t+1}, f_t)`` sits at position t in both).

vLLM's layer is always a Llama layer, so drafters of the Llama family (SmolLM2, Llama 2/3) and
of Qwen2 (Qwen2, Qwen2.5, Qwen2.5-Coder: a Llama layer with biases on q/k/v only, which vLLM's
Llama layer builds from ``qkv_bias: true``; ``attention_bias`` would also give o_proj one) are
exported; others are refused by name.

What differs from specdec's own decoding with the drafter: vLLM drafts a chain of
``num_speculative_tokens`` (each the drafter's top-1) where specdec grows a dynamic tree, and it
scores the target's whole vocabulary with the target's LM head: our drafter's reduced
vocabulary (its ``vocab_ids``) is specdec's alone and not exported, so vLLM's drafts may pick
ids our drafter never proposes (greedy output is the target's either way).

Files written: ``config.json`` (a Llama config: ``architectures: ["EagleLlamaForCausalLM"]``,
the layer's sizes, rope settings, ``rms_norm_eps``, ``vocab_size`` = the target's,
``num_hidden_layers: 1``, ``torch_dtype``; under ``"specdec"`` what the drafter was made for)
and ``model.safetensors`` (``fc.weight``, ``layers.0.*`` in Hugging Face names, which vLLM's
loader prefixes with ``model.`` and stacks into ``qkv_proj``/``gate_up_proj``).

Example::

    export_eagle("drafter/", "drafter-vllm/")          # a directory from specdec train-eagle
    LLM(model="path/to/target", **eagle_engine_args("drafter-vllm/", "path/to/target",
                                                     num_speculative_tokens=3))
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import Tensor

from specdec.integrations.vllm.checkpoint import check_made_for, read_config, write_checkpoint
from specdec.proposers.eagle.files import read_saved

__all__ = ["SUPPORTED_MODEL_TYPES", "eagle_engine_args", "export_eagle"]

FORMAT = "specdec-eagle-vllm"
FORMAT_VERSION = 1
ARCHITECTURE = "EagleLlamaForCausalLM"
#: Target families whose decoder layer vLLM's EagleLlamaForCausalLM reproduces.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2")



def export_eagle(drafter: Any, out_dir: str | os.PathLike[str]) -> Path:
    """Write an EAGLE drafter into ``out_dir`` for vLLM's ``eagle`` method; returns ``out_dir``.

    ``drafter``: an :class:`~specdec.proposers.eagle.drafter.EagleDrafter` or the directory its
    ``save`` wrote (``specdec train-eagle``'s output). The drafter's layer must be of the Llama
    or Qwen2 family (:data:`SUPPORTED_MODEL_TYPES`): vLLM builds its EAGLE layer as a Llama layer.

    vLLM scores the target's full vocabulary with the target's LM head; the drafter's reduced
    vocabulary (``vocab_ids``, which specdec scores alone) is not carried over, and vLLM drafts a
    chain of its top-1 tokens, not specdec's tree.

    Raises ValueError for an unsupported architecture or weights that do not match the config,
    FileNotFoundError for a directory without the drafter's files.
    """
    meta, state = _read_drafter(drafter)
    config = _vllm_config(meta)
    layer = meta["layer_config"]
    expected = _expected_shapes(meta["hidden_size"], layer, config)
    missing = sorted(set(expected) - set(state))
    unknown = sorted(set(state) - set(expected))
    if missing or unknown:
        raise ValueError(f"specdec.vllm.export_eagle: the drafter's weights do not match its config "
                         f"(a {layer.get('model_type')} layer): missing {missing[:4]}, unexpected {unknown[:4]}")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise ValueError(f"specdec.vllm.export_eagle: {name} has shape {tuple(state[name].shape)}, "
                             f"the drafter's config gives {shape}")
    return write_checkpoint(out_dir, state, config)


def eagle_engine_args(drafter_dir: str | os.PathLike[str], target: str | os.PathLike[str],
                      num_speculative_tokens: int = 3) -> dict[str, Any]:
    """vLLM engine arguments (``LLM(model=target, **eagle_engine_args(...))``) that serve a
    drafter exported by :func:`export_eagle`, after checking that it was made for the model in
    directory ``target`` (hidden size and vocabulary).

    ``speculative_config``: the ``eagle`` method over ``drafter_dir``, drafting chains of
    ``num_speculative_tokens`` tokens (vLLM requires the number; 3 by default).

    Raises ValueError, naming both sizes, for a drafter trained for another model.
    """
    drafter_cfg = read_config(Path(drafter_dir), "exported EAGLE drafter")
    if drafter_cfg.get("architectures") != [ARCHITECTURE]:
        raise ValueError(f"specdec.vllm: {drafter_dir} holds no EAGLE drafter for vLLM (architectures "
                         f"{drafter_cfg.get('architectures')!r}); write it with export_eagle")
    check_made_for(drafter_cfg, target, f"the EAGLE drafter in {drafter_dir} was", "a drafter")
    if not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 1:
        raise ValueError(f"specdec.vllm: num_speculative_tokens must be an int >= 1, got {num_speculative_tokens!r}")
    return {"speculative_config": {"method": "eagle", "model": str(drafter_dir),
                                   "num_speculative_tokens": num_speculative_tokens}}


def _read_drafter(drafter: Any) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """The drafter's config (EagleDrafter.save's fields) and weights, from the module or its
    directory."""
    if isinstance(drafter, (str, os.PathLike)):
        meta, state = read_saved(drafter, "specdec.vllm.export_eagle")
        state.pop("vocab_ids", None)  # specdec's reduced vocabulary: vLLM scores the full one
        return meta, state
    config = getattr(drafter, "config", None)
    if config is None or not hasattr(drafter, "weights") or not hasattr(config, "layer_config"):
        raise TypeError(f"specdec.vllm.export_eagle: expected an EagleDrafter or its directory, got "
                        f"{type(drafter).__name__}")
    meta = {"hidden_size": config.hidden_size, "target_vocab_size": config.target_vocab_size,
            "draft_vocab_size": config.draft_vocab_size, "layer_config": dict(config.layer_config),
            "target": config.target, "dtype": str(drafter.dtype).removeprefix("torch.")}
    return meta, dict(drafter.weights())


def _vllm_config(meta: dict[str, Any]) -> dict[str, Any]:
    """The config.json of vLLM's EagleLlamaForCausalLM for a drafter's config."""
    layer = meta["layer_config"]
    model_type = layer.get("model_type")
    made_for = meta.get("target") or "its target"
    if model_type not in SUPPORTED_MODEL_TYPES:
        arch = ", ".join(layer.get("architectures") or []) or "unknown architecture"
        raise ValueError(f"specdec.vllm.export_eagle: the drafter's layer is of a {model_type!r} model "
                         f"({arch}, {made_for}); vLLM's EAGLE drafter ({ARCHITECTURE}) is a Llama layer, "
                         f"so only the Llama and Qwen2 families are exported (model_type "
                         f"{' or '.join(repr(t) for t in SUPPORTED_MODEL_TYPES)})")
    if layer.get("hidden_act", "silu") != "silu":
        raise ValueError(f"specdec.vllm.export_eagle: the drafter's layer uses {layer['hidden_act']!r}; "
                         f"vLLM's Llama layer has SiLU only")
    H = meta["hidden_size"]
    heads = layer["num_attention_heads"]
    if model_type == "qwen2":  # biases on q, k, v, none on o_proj
        bias = {"attention_bias": False, "qkv_bias": True}
    else:  # Llama: attention_bias puts a bias on q, k, v and o_proj
        bias = {"attention_bias": bool(layer.get("attention_bias", False))}
    dtype = meta.get("dtype", "float32")
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": layer["intermediate_size"],
        "num_attention_heads": heads,
        "num_key_value_heads": layer.get("num_key_value_heads") or heads,
        "head_dim": layer.get("head_dim") or H // heads,
        "hidden_act": "silu",
        "max_position_embeddings": layer.get("max_position_embeddings", 4096),
        "rms_norm_eps": layer["rms_norm_eps"],
        "rope_parameters": _rope(layer),
        **bias,
        "mlp_bias": bool(layer.get("mlp_bias", False)),
        "num_hidden_layers": 1,
        "vocab_size": meta["target_vocab_size"],
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "specdec": {"format": FORMAT, "format_version": FORMAT_VERSION, "target": meta.get("target"),
                    "target_model_type": model_type, "draft_vocab_size": meta.get("draft_vocab_size"),
                    "note": "vLLM drafts over the target's full vocabulary with the target's LM head"},
    }


def _rope(layer: dict[str, Any]) -> dict[str, Any]:
    """Rotary settings in transformers 5's ``rope_parameters`` form (which vLLM 0.32 reads),
    also from a config of transformers 4 (``rope_theta`` and ``rope_scaling``)."""
    rope = layer.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        return dict(rope)
    rope = dict(layer.get("rope_scaling") or {})
    rope["rope_type"] = rope.pop("type", None) or rope.get("rope_type") or "default"
    rope["rope_theta"] = layer.get("rope_theta", 10000.0)
    return rope


def _expected_shapes(H: int, layer: dict[str, Any], config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every weight vLLM's layer loads, with its shape."""
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    inter = config["intermediate_size"]
    p = "layers.0."
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (H, 2 * H),
        p + "self_attn.q_proj.weight": (q, H), p + "self_attn.k_proj.weight": (kv, H),
        p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.o_proj.weight": (H, q),
        p + "post_attention_layernorm.weight": (H,),
        p + "mlp.gate_proj.weight": (inter, H), p + "mlp.up_proj.weight": (inter, H),
        p + "mlp.down_proj.weight": (H, inter),
    }
    if config.get("qkv_bias") or config["attention_bias"]:
        shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.bias": (kv,)})
    if config["attention_bias"]:
        shapes[p + "self_attn.o_proj.bias"] = (H,)
    if config["mlp_bias"]:
        shapes.update({p + "mlp.gate_proj.bias": (inter,), p + "mlp.up_proj.bias": (inter,),
                       p + "mlp.down_proj.bias": (H,)})
    return shapes

