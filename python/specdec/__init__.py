"""specdec: speculative decoding ops for PyTorch."""
import torch  # noqa: F401  (loads libtorch before the extension)

from specdec import _C  # noqa: F401  (registers torch.ops.specdec.*)
