"""Tiny random-weight causal LMs (seeded) for decoder logic tests; no download."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

CONFIGS = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
}


def tiny_lm(family: str = "llama", seed: int = 0, vocab: int = 96, layers: int = 2,
            init: float = 0.3, **overrides) -> torch.nn.Module:
    """A small model whose logits are peaked enough (``init``) that greedy decoding has clear
    winners and falls into repetitive text, as real models do."""
    config_cls, model_cls = CONFIGS[family]
    settings = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        initializer_range=init, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
        pad_token_id=2)
    config = config_cls(**{**settings, **overrides})
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_cls(config)
    return model.eval()


def perturbed(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """A copy of ``model`` with noise on every weight: a draft that agrees only partly."""
    copy = type(model)(model.config).eval()
    copy.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std())
    return copy


def cyclic_lm(family: str = "llama", seed: int = 5) -> torch.nn.Module:
    """A tiny model that mostly reads its current token (attention outputs scaled down): its
    greedy text soon repeats itself, as answers that copy their prompt do."""
    model = tiny_lm(family, seed=seed)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.02)
    return model


def random_drafter(target: torch.nn.Module, draft_vocab_size: int | None = None, seed: int = 0,
                   scale: float = 0.2, vocab_ids: torch.Tensor | None = None):
    """An untrained EAGLE drafter for ``target`` (its last layer, ``fc`` adding the token's
    embedding to the feature), with seeded noise on its weights (the output projections a
    fresh drafter zeroes get some too): partly right proposals. It scores ``vocab_ids``, or the
    lowest ``draft_vocab_size`` ids (default: all)."""
    from specdec import EagleDrafter

    drafter = EagleDrafter.for_target(target, draft_vocab_size or target.config.vocab_size, vocab_ids=vocab_ids)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad:
                spread = float(p.std()) or 0.05
                p.add_(torch.randn(p.shape, generator=gen).to(p.device) * scale * spread)
    return drafter


def bigram_target(family: str = "llama", seed: int = 41) -> torch.nn.Module:
    """A one-layer target whose attention adds nothing (o_proj zeroed): its hidden state at t,
    and so its next token, is a function of token t alone."""
    target = tiny_lm(family, seed=seed, layers=1)
    with torch.no_grad():
        target.model.layers[0].self_attn.o_proj.weight.zero_()
    return target


def oracle_drafter(target: torch.nn.Module, noise: float = 0.0, seed: int = 0,
                   vocab_ids: torch.Tensor | None = None):
    """The EAGLE drafter that predicts a `bigram_target` exactly: its layer is the target's (the
    input norm only feeds the zeroed attention), ``fc`` passes the token's embedding and drops
    the feature, and without the final norm its logits are the target's scaled by a positive
    factor. ``noise``: seeded noise on the layer's weights, this many times their spread (its
    first choices then sometimes wrong). ``vocab_ids``: the ids it scores (default: all); where
    the target's token is among them, it is the drafter's first choice."""
    from specdec import EagleDrafter

    drafter = EagleDrafter.for_target(target, target.config.vocab_size, vocab_ids=vocab_ids)
    H = target.config.hidden_size
    layer = {k: v for k, v in target.model.layers[0].state_dict().items() if not k.startswith("input_layernorm")}
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        drafter.layer.load_state_dict(layer)  # the output projections too (a fresh drafter's are zero)
        drafter.fc.weight.copy_(torch.cat([torch.eye(H), torch.zeros(H, H)], 1))
        for p in drafter.layer.parameters() if noise else ():
            p.add_(torch.randn(p.shape, generator=gen) * noise * float(p.std()))
    return drafter
