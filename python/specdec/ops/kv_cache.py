"""KV-cache commit: accepted entries moved in place for every layer in one launch."""

from __future__ import annotations

import torch
from torch import Tensor

_ops = torch.ops.specdec


def kv_commit(
    k_caches: list[Tensor],
    v_caches: list[Tensor],
    lengths: Tensor,
    src_pos: Tensor,
    accept_len: Tensor,
) -> None:
    """Moves the accepted entries of every layer's KV cache into place, in place.

    For every layer and row ``b``: ``cache[b, :, lengths[b] + i] = cache[b, :, src_pos[b, i]]``
    for ``i < accept_len[b]``, copied in order of ``i`` (so overlapping sources and
    destinations are right whenever ``src_pos[b, i] >= lengths[b] + i``, as for the nodes of a
    tree path); then ``lengths[b] += accept_len[b]``. Rolling back is only lowering
    ``lengths``.

    Args:
        k_caches, v_caches: one ``[B, Hkv, S, D]`` contiguous tensor per layer (all of a list
            one shape; one dtype and device).
        lengths: ``[B]`` int64 or int32, contiguous: updated in place.
        src_pos: ``[B, A]`` absolute source positions (lengths' dtype); columns past
            ``accept_len[b]`` are ignored.
        accept_len: ``[B]`` number of entries to move per row, ``0 <= accept_len <= A``.

    Example:
        >>> k = torch.arange(6.0).view(1, 1, 6, 1).contiguous(); v = k.clone()
        >>> lengths = torch.tensor([2])
        >>> kv_commit([k], [v], lengths, torch.tensor([[3, 5]]), torch.tensor([2]))
        >>> k.flatten().tolist(), lengths.tolist()
        ([0.0, 1.0, 3.0, 5.0, 4.0, 5.0], [4])
    """
    _ops.kv_commit(k_caches, v_caches, lengths, src_pos, accept_len)
