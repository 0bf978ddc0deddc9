"""One forward of a Hugging Face causal LM over a whole token tree (or a prompt), on a SpecCache.

:func:`enable_tree_attention` registers :func:`specdec.ops.tree_attention` as the
``transformers`` attention implementation ``"specdec_tree"`` (through the public
``AttentionInterface``) and selects it for a model. :func:`specdec.model.forward.tree_forward` then runs the model
once over ``tree_tokens [B, T]``: node i of row b is placed at position
``lengths[b] + depth[b, i]``, its key/value are written at cache slot ``lengths[b] + i``, and it
attends to the row's committed positions and to its tree ancestors. The logits of every node
equal those of running its root-to-node path on its own after the same prefix.

Passing ``parents=None`` runs a chain instead (causal attention among the T tokens), which is
how a prompt is prefilled. Ragged prompts are RIGHT-padded: row b's prompt is
``tokens[b, :n_b]``; everything after it is padding that no real token attends to (it comes
later in the causal order) and that the cache drops, because only ``n_b`` entries are kept
(``cache.advance(n)``, see :func:`prefill`). The logits of the prompt's last token are
``logits[b, n_b - 1]``.

Supported: decoder-only models whose attention modules call the attention interface (Llama,
Qwen2, Mistral, Gemma, ... in transformers 5), without attention-logit soft-capping and with
any sliding window at least as long as the cache.

Requires transformers >= 5 (its ``Cache`` layers and ``cache=`` forward argument).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel

from specdec import ops


ATTN_IMPLEMENTATION = "specdec_tree"


def _tree_attention_interface(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    specdec_prefix_len: Tensor | None = None,
    specdec_tree_mask: Tensor | None = None,
    specdec_kv_len: int | None = None,
    specdec_slot_mask: Tensor | None = None,
    specdec_packed: list[tuple[int, int, int]] | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """The ``"specdec_tree"`` attention function: query [B, H, T, D], key/value the whole
    SpecCache buffers [B, Hkv, S, D]; returns [B, T, H, D] as transformers expects. In a packed
    pass the query is [1, H, N, D], the first nodes of each row one after the other, and
    ``specdec_packed`` lists runs ``(first row, rows, width)`` of consecutive rows with as many
    nodes: each run is one attention call over views of its rows."""
    if specdec_prefix_len is None:
        raise ValueError(
            "specdec: the 'specdec_tree' attention runs only inside specdec.tree_forward "
            "(with a SpecCache); call model.set_attn_implementation('sdpa') for plain use"
        )
    if softcap is not None:
        raise NotImplementedError("specdec: tree attention has no attention-logit soft-capping")
    if sliding_window is not None and sliding_window < key.shape[2]:
        raise NotImplementedError(
            f"specdec: the model's sliding window ({sliding_window}) is shorter than the "
            f"SpecCache ({key.shape[2]}); use max_length <= {sliding_window}"
        )
    if dropout:
        raise NotImplementedError("specdec: tree attention has no dropout (use model.eval())")
    if specdec_kv_len is not None:
        return _causal_attention(query, key, value, specdec_prefix_len, specdec_kv_len, scaling), None
    if specdec_packed is None:
        return _masked_attention(query, key, value, specdec_prefix_len, specdec_tree_mask, specdec_slot_mask,
                                 scaling), None
    H, D = query.shape[1], query.shape[3]
    outs, start = [], 0
    for first, rows, width in specdec_packed:
        q = query[0, :, start: start + rows * width].view(H, rows, width, D).transpose(0, 1)
        r = slice(first, first + rows)
        tree = None if specdec_tree_mask is None else specdec_tree_mask[r, :width, :width]
        slots = None if specdec_slot_mask is None else specdec_slot_mask[r, :width]
        outs.append(_masked_attention(q, key[r], value[r], specdec_prefix_len[r], tree, slots,
                                      scaling).reshape(rows * width, H, D))
        start += rows * width
    return torch.cat(outs)[None], None


def _masked_attention(query: Tensor, key: Tensor, value: Tensor, prefix_len: Tensor, tree_mask: Tensor | None,
                      slot_mask: Tensor | None, scaling: float | None) -> Tensor:
    """[B, T, H, D]: the queries over each row's prefix and the nodes the mask shows."""
    if slot_mask is not None:
        return _slot_attention(query, key, value, slot_mask, scaling)
    return ops.tree_attention(query, key, value, prefix_len, tree_mask, scaling).transpose(1, 2)


def _causal_attention(query: Tensor, key: Tensor, value: Tensor, prefix_len: Tensor, kv_len: int,
                      scaling: float | None) -> Tensor:
    """A long chain (a prompt) after each row's prefix, through PyTorch's fused SDPA: a prompt
    needs no tree mask, and the fused kernels tile long sequences better than the tree kernel.
    ``kv_len``: the longest row's prefix + T (only those cache slots are read)."""
    T = query.shape[2]
    key, value = key[:, :, :kv_len], value[:, :, :kv_len]
    if kv_len == T:  # no row has a prefix: plain causal attention
        mask, causal = None, True
    else:  # row b's token i sees slots 0 .. prefix_len[b] + i
        last = prefix_len[:, None] + torch.arange(T, device=query.device)
        mask = (torch.arange(kv_len, device=query.device) <= last[:, :, None])[:, None]
        causal = False
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=causal,
                                         scale=scaling, enable_gqa=True)
    return out.transpose(1, 2)



def _slot_attention(query: Tensor, key: Tensor, value: Tensor, visible: Tensor, scaling: float | None) -> Tensor:
    """Attention of T new nodes over the cache slots ``visible [B, T, kv_len]`` marks, through
    PyTorch's SDPA (a draft's tree passes: they only propose, so they need no row-count
    invariance). The queries of each KV head are stacked (``[B, Hkv, G T, D]``), which runs
    faster on CPU than SDPA's own grouped-query path with a mask (docs/benchmarks.md)."""
    B, H, T, D = query.shape
    Hkv, kv_len = key.shape[1], visible.shape[-1]
    G = H // Hkv
    mask = visible[:, None].expand(B, G, T, kv_len).reshape(B, 1, G * T, kv_len)
    out = F.scaled_dot_product_attention(query.reshape(B, Hkv, G * T, D), key[:, :, :kv_len],
                                         value[:, :, :kv_len], attn_mask=mask, scale=scaling)
    return out.reshape(B, H, T, D).transpose(1, 2)  # CUDA's SDPA may return it strided


def enable_tree_attention(model: PreTrainedModel) -> None:
    """Registers the ``"specdec_tree"`` attention implementation (idempotent) and selects it
    for ``model``. The model then runs only through :func:`tree_forward` and :func:`prefill`
    (select another implementation, e.g. ``model.set_attn_implementation("sdpa")``, to use it
    otherwise). No mask function is registered: transformers builds no mask for it, the tree
    mask travels in the forward's keyword arguments."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, _tree_attention_interface)
    model.set_attn_implementation(ATTN_IMPLEMENTATION)


@contextlib.contextmanager
def tree_attention_enabled(*models: PreTrainedModel) -> Iterator[None]:
    """Selects ``"specdec_tree"`` attention for ``models`` inside the block and restores each
    model's own implementation afterwards, so a decoder call leaves the models as it found them."""
    previous = [m.config._attn_implementation for m in models]
    for m in models:
        enable_tree_attention(m)
    try:
        yield
    finally:
        for m, implementation in zip(models, previous):
            m.set_attn_implementation(implementation)
