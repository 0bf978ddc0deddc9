"""A target's linear layers on CPU: ``linear``, whose every output row has the same bits whatever
the number of rows in the product (docs/verification.md)."""

from __future__ import annotations

import torch
from torch import Tensor

_ops = torch.ops.specdec


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` on CPU, float32 or bfloat16, each output row computed the same way
    for any number of rows.

    A speculative decoder verifies k tokens in one target pass where plain decoding runs k
    one-token passes; it reproduces the target's own output only if a token's logits do not
    depend on how many tokens share the pass. ``torch.nn.functional.linear`` does not promise
    that (MKL takes other paths for 1, 2-3 and 4+ rows); this op does: every output is one dot
    product summed in a fixed order. It streams the weight once per call, which makes the
    one-row products of a decoding step run at the machine's memory bandwidth. bfloat16 is
    widened to float32 (exactly), summed in float32 and rounded once.

    Args:
        x: ``[M, K]`` float32 or bfloat16 (rows may be strided; the last dimension is made
            contiguous).
        weight: ``[N, K]``, x's dtype, contiguous.
        bias: ``[N]``, x's dtype, or None.

    Returns:
        ``[M, N]`` in x's dtype.

    Example:
        >>> w, x = torch.randn(6, 16), torch.randn(5, 16)
        >>> y = linear(x, w)
        >>> torch.equal(linear(x[2:3], w), y[2:3])      # the same bits alone as among 5 rows
        True
        >>> torch.allclose(y, x @ w.T, atol=1e-5)
        True
    """
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    _ops.linear(x, weight, bias, out=out)
    return out
