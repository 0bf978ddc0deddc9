"""Tree attention: a pass's nodes over each row's committed cache entries and their tree ancestors."""

from __future__ import annotations

import torch
from torch import Tensor

_ops = torch.ops.specdec


def tree_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    prefix_len: Tensor,
    tree_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Attention of T new tokens per row over the row's cached prefix and their tree ancestors.

    Row ``b`` has ``prefix_len[b]`` committed positions (``0 .. prefix_len[b] - 1`` of the
    cache) and its T new tokens' keys/values at ``prefix_len[b] .. prefix_len[b] + T - 1``.
    New token ``i`` attends to every committed position and to the new tokens ``j`` with
    ``tree_mask[b, i, j]`` (its ancestors and itself); ``tree_mask=None`` means a chain (causal:
    ``j <= i``), as in a prefill. Grouped-query attention: the H query heads share the Hkv
    key/value heads in groups of ``H // Hkv``. A token that sees no position gets zeros.

    Args:
        q: ``[B, H, T, D]`` queries (float32, float16 or bfloat16; computed in float32).
        k_cache, v_cache: ``[B, Hkv, S, D]`` caches (q's dtype, last dimension contiguous).
        prefix_len: ``[B]`` committed lengths (int64 or int32), ``0 <= prefix_len <= S - T``.
        tree_mask: ``[B, T, T]`` bool (see :func:`build_tree`), or ``None`` for causal.
        scale: score scale, default ``1 / sqrt(D)``.

    Returns:
        ``[B, H, T, D]`` in q's dtype.

    Example:
        >>> q = torch.zeros(1, 1, 2, 4)                   # equal scores: a plain average
        >>> k = torch.zeros(1, 1, 4, 4)
        >>> v = torch.arange(4.0).view(1, 1, 4, 1).expand(1, 1, 4, 4).contiguous()
        >>> mask = torch.tensor([[[True, False], [False, True]]])   # two siblings
        >>> tree_attention(q, k, v, torch.tensor([1]), mask)[0, 0, :, 0].tolist()
        [0.5, 1.0]
    """
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    _ops.tree_attention(q, k_cache, v_cache, prefix_len, tree_mask, scale, out=out)
    return out
