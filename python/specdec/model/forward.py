"""One forward pass of a Hugging Face causal LM over a token tree (or any attention pattern) on a
SpecCache: :func:`tree_forward` (see :mod:`specdec.model.attention` for the attention it runs)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor
from transformers import PreTrainedModel

from specdec import ops
from specdec.model.attention import ATTN_IMPLEMENTATION
from specdec.model.cache import SpecCache


@functools.cache
def _forward_parameters(cls: type) -> frozenset[str]:
    """The keyword parameters of a model class's ``forward``, read once per class."""
    return frozenset(inspect.signature(cls.forward).parameters)


def _cache_kwarg(model: PreTrainedModel) -> str:
    return "cache" if "cache" in _forward_parameters(type(model)) else "past_key_values"


def node_layout(parents: Tensor | None, lengths: Tensor, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The attention mask among a pass's nodes ``[B, T, T]`` and their absolute positions
    ``[B, T]``: those given, else the tree's (a node sees its ancestors and sits at
    ``lengths + depth``)."""
    if attention_mask is not None and position_ids is not None:
        return attention_mask, position_ids
    if parents is None:
        raise ValueError("specdec.tree_forward: an attention_mask needs position_ids or parents")
    tree_mask, depth, _ = ops.build_tree(parents, max_leaves=1, max_depth=0)
    if position_ids is None:
        position_ids = lengths[:, None] + depth.to(lengths.dtype)
    return (tree_mask if attention_mask is None else attention_mask), position_ids


# Chains at least this long (prompts) go through fused SDPA, which tiles long sequences better
# than the tree kernel (docs/benchmarks.md: the kernel's prefill falls further behind the
# longer the prompt); shorter ones (a draft's pending tokens) through the tree kernel, which
# needs no host read of the lengths. SDPA's logits depend on the chain's length, which exactness does
# not need: a prompt is prefilled by the same pass whatever the method (method=None included);
# the verify loop's passes always carry a mask and take the row-invariant kernel.
SDPA_MIN_CHAIN = 16


class PassOutput(NamedTuple):
    """What one pass computed: ``logits [B, T, V]`` and, when asked for, the decoder's final
    hidden states ``hidden [B, T, H]`` (after the final norm: the LM head's input)."""

    logits: Tensor
    hidden: Tensor | None


def tree_forward(model: PreTrainedModel, cache: SpecCache, tree_tokens: Tensor, parents: Tensor | None = None,
                 keep: Tensor | None = None, head: Callable[[Tensor], Tensor] | None = None, *,
                 attention_mask: Tensor | None = None, position_ids: Tensor | None = None, pending: int = 0,
                 widths: Tensor | None = None, inputs_embeds: Tensor | None = None) -> Tensor:
    """The logits of :func:`forward_pass` (the same arguments; no hidden states)."""
    return forward_pass(model, cache, tree_tokens, parents, keep, head, attention_mask=attention_mask,
                        position_ids=position_ids, pending=pending, widths=widths,
                        inputs_embeds=inputs_embeds).logits


@torch.no_grad()
def forward_pass(
    model: PreTrainedModel,
    cache: SpecCache,
    tree_tokens: Tensor,
    parents: Tensor | None = None,
    keep: Tensor | None = None,
    head: Callable[[Tensor], Tensor] | None = None,
    *,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
    return_hidden: bool = False,
    pending: int = 0,
    widths: Tensor | None = None,
    inputs_embeds: Tensor | None = None,
    all_hidden: bool = False,
) -> PassOutput:
    """Logits of every node of a token tree (or of any attention pattern) per row, in one
    forward pass.

    Args:
        model: a causal LM with :func:`enable_tree_attention` applied.
        cache: its :class:`~specdec.model.cache.SpecCache`; row b's node i is written at slot
            ``cache.lengths[b] + i``; ``cache.lengths`` is not changed (commit afterwards).
        tree_tokens: ``[B, T]`` token of every node (node 0, the root, is the last emitted
            token, whose key/value are not cached yet).
        parents: ``[B, T]`` the trees (see :func:`specdec.ops.build_tree`): each node attends to
            its ancestors and sits at ``cache.lengths + depth``. ``None`` without
            ``attention_mask``: a chain of T tokens (causal; a prefill).
        keep: ``[K]`` sorted node indices whose logits are wanted (default: all). The LM head
            then runs on those K positions only (``logits_to_keep``), which matters for prompts.
        head: scores the decoder's last hidden states ``[B, K, H]`` in place of the model's own
            LM head (e.g. over part of the vocabulary: a draft's reduced head). The model's
            ``get_decoder()`` runs alone; logit scaling or soft-capping of the model is skipped.
        attention_mask: ``[B, T, T]`` bool, which of the T nodes each node attends to (itself
            included); every node also attends to the row's committed prefix. Overrides the
            mask ``parents`` would give; needs ``position_ids`` or ``parents``.
        position_ids: ``[B, T]`` absolute positions of the nodes (default: from ``parents``).
        return_hidden: also compute the decoder's final hidden states (after the final norm,
            the LM head's input) ``[B, T, H]`` (``[B, K, H]`` with ``keep``), from this pass.
        pending: nodes of the same tree that earlier calls wrote after each row's committed
            entries (``cache.lengths[b] ..``) and that stay uncommitted: a tree computed level
            by level. The T new nodes are then written after them, and ``attention_mask``
            (required, with ``position_ids``) is ``[B, T, pending + T]``: which of the pending
            and new nodes each new node sees.
        widths: ``[B]``, row b computes only its first ``widths[b]`` nodes (>= 1; with
            ``parents`` or ``attention_mask``, none of them attending to a later node). The
            others are skipped: nothing is written to their cache slots, their logits (and
            hidden states) are zero. The pass is then packed: the linear layers run over the
            computed nodes only, so a batch whose rows propose different numbers of nodes pays
            for each row's own rather than for every row at the widest; attention runs per
            row as in the rectangular pass, so a node's logits do not change. One host read.
        inputs_embeds: ``[B, T, H]`` the decoder's inputs in place of the nodes' token
            embeddings (an EAGLE drafter's, `specdec.EagleDrafter.inputs`); ``tree_tokens``
            then only gives the shape.
        all_hidden: with ``return_hidden`` and ``keep``: the hidden states of every node
            ``[B, T, H]``, the logits of the kept ones only (an EAGLE drafter reads every prompt
            token's).

    Returns:
        ``PassOutput(logits, hidden)``: ``[B, T, V]`` logits (``[B, K, V]`` with ``keep``), the
        model's next-token logits after each node; ``hidden`` with ``return_hidden``, else None.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> from specdec.model.attention import enable_tree_attention
        >>> from specdec.model.prefill import prefill
        >>> _ = torch.manual_seed(0)
        >>> cfg = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        ...                   num_hidden_layers=2, intermediate_size=64, vocab_size=50)
        >>> model = LlamaForCausalLM(cfg).eval()
        >>> enable_tree_attention(model)
        >>> cache = SpecCache(cfg, batch_size=1, max_length=32)
        >>> _ = prefill(model, cache, torch.tensor([[1, 2, 3]]))
        >>> tree = torch.tensor([[4, 5, 6]])                    # 5 and 6 both follow 4
        >>> logits = tree_forward(model, cache, tree, torch.tensor([[-1, 0, 0]]))
        >>> alone = tree_forward(model, cache, torch.tensor([[4, 6]]))   # the path 4 -> 6
        >>> torch.allclose(logits[0, 2], alone[0, 1], atol=1e-5)
        True
    """
    if model.config._attn_implementation != ATTN_IMPLEMENTATION:
        raise ValueError(
            "specdec.tree_forward: call specdec.model.attention.enable_tree_attention(model) first "
            f"(the model uses {model.config._attn_implementation!r} attention)"
        )
    if tree_tokens.dim() != 2:
        raise ValueError(f"specdec.tree_forward: tree_tokens must be [B, T], got {tuple(tree_tokens.shape)}")
    B, T = tree_tokens.shape
    lengths = cache.lengths
    if lengths.shape[0] != B:
        raise ValueError(f"specdec.tree_forward: tree_tokens has {B} rows, the cache {lengths.shape[0]}")
    # The longest row: read once on CPU (free there); on CUDA only for a long chain (a prompt).
    longest = int(lengths.max()) if lengths.device.type == "cpu" else None
    span = pending + T
    if longest is not None and longest + span > cache.max_length:
        raise ValueError(
            f"specdec.tree_forward: {span} more tokens do not fit the cache (max_length "
            f"{cache.max_length}, longest row {longest})"
        )
    if pending and (attention_mask is None or position_ids is None):
        raise ValueError("specdec.tree_forward: pending nodes need attention_mask and position_ids")
    if attention_mask is not None and (attention_mask.shape != (B, T, span) or attention_mask.dtype != torch.bool):
        raise ValueError(f"specdec.tree_forward: attention_mask must be bool [{B}, {T}, {span}], "
                         f"got {attention_mask.dtype} {tuple(attention_mask.shape)}")
    if position_ids is not None and position_ids.shape != (B, T):
        raise ValueError(f"specdec.tree_forward: position_ids must be [{B}, {T}], got {tuple(position_ids.shape)}")
    mask, kv_len = attention_mask, None
    if parents is None and mask is None:  # a chain
        if position_ids is None:
            position_ids = lengths[:, None] + torch.arange(T, device=lengths.device)
        if T >= SDPA_MIN_CHAIN:
            kv_len = (int(lengths.max()) if longest is None else longest) + T
    else:
        mask, position_ids = node_layout(parents, lengths, mask, position_ids)
    if inputs_embeds is not None and inputs_embeds.shape[:2] != (B, T):
        raise ValueError(f"specdec.tree_forward: inputs_embeds must be [{B}, {T}, H], got {tuple(inputs_embeds.shape)}")
    inputs = dict(input_ids=tree_tokens, position_ids=position_ids.to(lengths.dtype), use_cache=True,
                  specdec_prefix_len=lengths, specdec_tree_mask=mask, specdec_kv_len=kv_len)
    if inputs_embeds is not None:
        del inputs["input_ids"]
        inputs["inputs_embeds"] = inputs_embeds
    index = None
    if widths is not None:
        if parents is None and attention_mask is None:
            raise ValueError("specdec.tree_forward: widths need parents or attention_mask")
        if keep is not None:
            raise ValueError("specdec.tree_forward: widths and keep cannot be combined")
        index, runs = _packing(widths, B, T)
    if index is not None:
        inputs.update(position_ids=inputs["position_ids"].flatten()[index][None], specdec_packed=runs)
        if inputs_embeds is None:
            inputs["input_ids"] = tree_tokens.flatten()[index][None]
        else:
            inputs["inputs_embeds"] = inputs_embeds.flatten(0, 1)[index][None]
    if pending:  # the cache writes after the pending nodes; attention sees the slots the mask says
        # CPU: only the slots in use (a free host read); elsewhere the whole cache, no sync.
        kv_len = longest + span if longest is not None else cache.max_length
        inputs["specdec_slot_mask"] = _slot_mask(lengths, mask, kv_len)
        lengths += pending
        try:
            return _packed_forward(model, cache, inputs, index, head, return_hidden, keep, B, T, all_hidden)
        finally:
            lengths -= pending
    return _packed_forward(model, cache, inputs, index, head, return_hidden, keep, B, T, all_hidden)


def _packing(widths: Tensor, B: int, T: int) -> tuple[Tensor | None, list[tuple[int, int, int]]]:
    """The flattened [B, T] indices of row b's first ``widths[b]`` nodes, row after row, and the
    runs ``(first row, rows, width)`` of consecutive rows as wide; None when every row is T wide."""
    if widths.shape != (B,):
        raise ValueError(f"specdec.tree_forward: widths must be [{B}], got {tuple(widths.shape)}")
    w = widths.tolist()
    if min(w) < 1 or max(w) > T:
        raise ValueError(f"specdec.tree_forward: widths must be within 1..{T}, got {w}")
    if min(w) == T:
        return None, []
    runs: list[tuple[int, int, int]] = []
    for b, n in enumerate(w):
        if runs and runs[-1][2] == n:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, n)
        else:
            runs.append((b, 1, n))
    nodes = torch.arange(T, device=widths.device)
    return (nodes < widths[:, None]).flatten().nonzero()[:, 0], runs


def _packed_forward(model: PreTrainedModel, cache: SpecCache, inputs: dict, index: Tensor | None,
                    head: Callable[[Tensor], Tensor] | None, return_hidden: bool,
                    keep: Tensor | None, B: int, T: int, all_hidden: bool = False) -> PassOutput:
    """`_forward`, over the nodes ``index`` (of the flattened [B, T]) packed into one sequence
    when given; the outputs unpacked to [B, T, ...] with zeros at the nodes not computed."""
    if index is None:
        return _forward(model, cache, inputs, keep, head, return_hidden, all_hidden)
    with cache.packed(index // T, index % T):
        out = _forward(model, cache, inputs, None, head, return_hidden)

    def unpack(x: Tensor) -> Tensor:
        return x.new_zeros(B * T, x.shape[-1]).index_copy_(0, index, x[0]).view(B, T, -1)

    return PassOutput(unpack(out.logits), None if out.hidden is None else unpack(out.hidden))


def _forward(model: PreTrainedModel, cache: SpecCache, inputs: dict, keep: Tensor | None,
             head: Callable[[Tensor], Tensor] | None, return_hidden: bool, all_hidden: bool = False) -> PassOutput:
    if head is not None or return_hidden:
        decoder = model.get_decoder()
        every = decoder(**inputs, **{_cache_kwarg(decoder): cache}).last_hidden_state
        hidden = every if keep is None else every[:, keep]
        logits = (head or model.get_output_embeddings())(hidden)
        return PassOutput(logits, (every if all_hidden else hidden) if return_hidden else None)
    kwargs = {_cache_kwarg(model): cache}
    head_subset = keep is not None and "logits_to_keep" in _forward_parameters(type(model))
    if head_subset:
        kwargs["logits_to_keep"] = keep
    logits = model(**inputs, **kwargs).logits
    return PassOutput(logits[:, keep] if keep is not None and not head_subset else logits, None)

def _slot_mask(prefix_len: Tensor, mask: Tensor, kv_len: int) -> Tensor:
    """``[B, T, kv_len]`` which cache slots each of T new nodes sees, from their mask ``[B, T, S]``
    over the S entries after each row's prefix (``S - T`` pending ones, then the new nodes):
    every prefix slot, and slot ``prefix_len[b] + j`` where ``mask[b, i, j]``."""
    B, T, S = mask.shape
    rel = torch.arange(kv_len, device=mask.device) - prefix_len[:, None]  # [B, kv_len]
    seen = torch.gather(mask, 2, rel.clamp(0, S - 1)[:, None, :].expand(B, T, kv_len))
    return (rel < 0)[:, None, :] | (((rel >= 0) & (rel < S))[:, None, :] & seen)
