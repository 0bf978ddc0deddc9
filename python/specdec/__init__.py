"""specdec: speculative decoding for PyTorch.

Compiled CPU/CUDA ops (``torch.ops.specdec.*``, typed wrappers in :mod:`specdec.ops`) for
verifying drafted tokens exactly, and decoders over Hugging Face ``transformers`` models.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import torch  # noqa: F401  (loads libtorch before the extension)

from specdec import _C, ops
from specdec.ops import TypicalAcceptance

__all__ = ["BuildInfo", "TypicalAcceptance", "build_info", "ops"]

# ---- n-gram pool (lookahead decoding) ----
from specdec.ngram_pool import NGramPool  # noqa: E402

__all__ += ["NGramPool"]


@dataclass(frozen=True)
class BuildInfo:
    version: str
    torch_version: str          # the torch the extension was compiled against
    cuda_kernels: bool          # whether CUDA kernels are compiled in
    cuda_archs: tuple[str, ...]  # CMake CUDA architectures, e.g. ("80-real", "90")


def build_info() -> BuildInfo:
    """What this build of specdec contains.

    Example:
        >>> info = build_info()
        >>> info.cuda_kernels in (True, False)
        True
    """
    try:
        pkg_version = version("specdec")
    except PackageNotFoundError:  # running from a source tree
        pkg_version = "0+unknown"
    archs = tuple(a for a in _C.cuda_archs.split(",") if a)
    return BuildInfo(pkg_version, _C.torch_version, bool(_C.with_cuda), archs)

# --- model loading and cheap CPU verification passes -------------------------------------------
from specdec import models  # noqa: E402
from specdec.accelerate import (  # noqa: E402
    PackedLinear,
    VerificationConfig,
    accelerate_verification,
    memory_overhead,
    profile_passes,
)

__all__ += [
    "PackedLinear",
    "VerificationConfig",
    "accelerate_verification",
    "memory_overhead",
    "models",
    "profile_passes",
]

# --- decoders (they need transformers: imported on first use) ------------------------------------
_DECODERS = {
    "generate": "specdec.decoders",
    "DraftModel": "specdec.decoders",
    "PromptLookup": "specdec.decoders",
    "GenerateOutput": "specdec.decoders",
    "SpecCache": "specdec.cache",
}
__all__ += list(_DECODERS)


def __getattr__(name: str):
    if name in _DECODERS:
        import importlib

        return getattr(importlib.import_module(_DECODERS[name]), name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")
