"""The linear layers :func:`specdec.model.prepare.pack_linear_layers` puts in place of a CPU
model's ``nn.Linear``s: :class:`DotLinear` (specdec's own kernel), :class:`PackedLinear`
(oneDNN's packed weights) and :class:`UpcastLinear` (bfloat16 drafts on CPUs without bfloat16
GEMMs); :func:`dense_weight` reads the weight back from any of them. docs/verification.md says
what each is for."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdec.ops import linear as specdec_linear

__all__ = ["DOT_DTYPES", "DotLinear", "PackedLinear", "UpcastLinear", "dense_weight"]

# The dtypes specdec.ops.linear multiplies.
DOT_DTYPES = (torch.float32, torch.bfloat16)


class _OnTheSameWeight(nn.Linear):
    """An ``nn.Linear`` made from another one: its own ``weight`` and ``bias`` are that layer's
    parameters themselves (no copy; a tied head stays tied)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None,
                         device="meta", dtype=linear.weight.dtype)
        self.weight = linear.weight
        self.bias = linear.bias


class PackedLinear(nn.Module):
    """Drop-in replacement for an ``nn.Linear`` (inference only) using a oneDNN-prepacked weight.

    The packed weight is an opaque MKLDNN tensor, kept as a plain attribute: it is not in
    ``state_dict()``, and the module stays on CPU in its dtype (``.to()`` does not move it).
    ``bias`` stays the original parameter. ``extra_bytes`` is the memory it adds: the packed copy
    when the plain weight stays in memory (used by another module, ``shared``), else only what
    the layout pads. Inputs of fewer than ``min_rows`` rows are padded with zero rows (see
    ``specdec.model.prepare.PackingConfig``).

    Example:
        >>> lin = nn.Linear(8, 4)
        >>> packed = PackedLinear(lin, batch_hint=16)
        >>> x = torch.randn(2, 3, 8)
        >>> torch.allclose(packed(x), lin(x), rtol=1e-5, atol=1e-6)
        True
    """

    def __init__(self, linear: nn.Linear, batch_hint: int, shared: bool = False, min_rows: int = 4) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.min_rows = min_rows
        with torch.no_grad():
            self.packed: Tensor = torch.ops.mkldnn._reorder_linear_weight(
                linear.weight.detach(), batch_hint
            )
        self.weight = None  # only the packed copy is kept (dense_weight unpacks it)
        self.bias = linear.bias
        packed_bytes = torch.ops.mkldnn._nbytes(self.packed)
        self.extra_bytes = packed_bytes if shared else packed_bytes - linear.weight.nbytes

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)
        n = rows.shape[0]
        if n < self.min_rows:
            rows = F.pad(rows, (0, 0, 0, self.min_rows - n))
        y = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return y[:n].reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}"


class DotLinear(_OnTheSameWeight):
    """An ``nn.Linear`` whose products on CPU (float32, bfloat16) run on ``specdec.ops.linear``:
    every output one dot product summed in a fixed order, so a row's outputs have the same bits whatever the
    number of rows in the pass (what keeps speculative decoding exact), and the weight streamed
    once per pass (what makes a decoding step's one-row products fast). It keeps the plain
    ``weight`` and ``bias`` parameters: no copy, ``state_dict()`` unchanged, a tied head still
    shared. Inputs of another dtype or device run as ``nn.Linear`` does. Inference only: no
    gradients flow through the op.

    Example:
        >>> lin = nn.Linear(8, 4)
        >>> dot = DotLinear(lin)
        >>> x = torch.randn(2, 3, 8)
        >>> torch.allclose(dot(x), lin(x), atol=1e-6), torch.equal(dot(x[:, :1]), dot(x)[:, :1])
        (True, True)
    """

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype not in DOT_DTYPES or x.dtype != self.weight.dtype or x.device.type != "cpu":
            return super().forward(x)
        y = specdec_linear(x.reshape(-1, self.in_features), self.weight, self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)


class UpcastLinear(_OnTheSameWeight):
    """An ``nn.Linear`` with low-precision weights whose products over ``upcast_rows`` rows or
    more run in float32, on a float32 copy of the weight made for that product (see
    ``specdec.model.prepare.PackingConfig``); narrower products run as ``nn.Linear`` does. The output keeps the
    weight's dtype. For drafts on CPUs without bfloat16 GEMMs, where torch multiplies a bfloat16
    weight row by row; inference only.

    Example:
        >>> lin = nn.Linear(8, 4).to(torch.bfloat16)
        >>> up = UpcastLinear(lin, upcast_rows=3)
        >>> x = torch.randn(5, 8, dtype=torch.bfloat16)
        >>> wide = torch.nn.functional.linear(x.float(), lin.weight.float(), lin.bias.float())
        >>> torch.equal(up(x), wide.to(torch.bfloat16)), torch.equal(up(x[:2]), lin(x[:2]))
        (True, True)
    """

    def __init__(self, linear: nn.Linear, upcast_rows: int) -> None:
        super().__init__(linear)
        self.upcast_rows = upcast_rows

    def forward(self, x: Tensor) -> Tensor:
        if x.numel() < self.upcast_rows * self.in_features:
            return super().forward(x)
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), self.weight.float(), bias).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, upcast_rows={self.upcast_rows}"


def dense_weight(linear: nn.Module) -> Tensor:
    """The ``[out_features, in_features]`` weight of an ``nn.Linear`` or a :class:`PackedLinear`
    as a plain tensor.

    A prepared layer holds only the packed copy, which is unpacked here into a new tensor (the
    same values: packing is a layout change only).

    Example:
        >>> lin = nn.Linear(8, 4)
        >>> torch.equal(dense_weight(PackedLinear(lin, batch_hint=16)), lin.weight)
        True
    """
    if isinstance(linear, PackedLinear):
        return linear.packed.to_dense()
    if isinstance(linear, nn.Linear):
        return linear.weight
    raise ValueError(f"expected a linear layer (nn.Linear or PackedLinear), not {type(linear).__name__}")
