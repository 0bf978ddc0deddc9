"""specdec: speculative decoding for PyTorch.

Compiled CPU/CUDA ops (``torch.ops.specdec.*``, typed wrappers in :mod:`specdec.ops`) for
verifying drafted tokens exactly, and decoders over Hugging Face ``transformers`` models
(``specdec.generate`` with ``DraftModel``, ``Medusa``, ``Lookahead`` or ``PromptLookup``; they need transformers and are
imported on first use).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import torch  # noqa: F401  (loads libtorch before the extension)

from specdec import _C, models, ops
from specdec.model.prepare import (PackingConfig, VerificationConfig, accelerate_verification, pack_linear_layers,
                                   profile_passes)
from specdec.ops import TypicalAcceptance

# Names served by modules that import transformers (or are seldom needed), loaded when first used.
_LAZY = {
    "generate": "specdec.loop.generate",
    "Batching": "specdec.loop.options",
    "GenerateOutput": "specdec.loop.stats",
    "GenerateStats": "specdec.loop.stats",
    "Method": "specdec.loop.protocol",
    "Proposer": "specdec.loop.protocol",
    "Proposal": "specdec.loop.protocol",
    "StepResult": "specdec.loop.protocol",
    "Context": "specdec.loop.protocol",
    "DraftModel": "specdec.proposers.draft.method",
    "PromptLookup": "specdec.proposers.prompt_lookup",
    "Lookahead": "specdec.proposers.lookahead",
    "Medusa": "specdec.proposers.medusa.proposer",
    "Eagle": "specdec.proposers.eagle.proposer",
    "Ensemble": "specdec.proposers.ensemble",
    "MedusaHeads": "specdec.proposers.medusa.heads",
    "train_medusa": "specdec.training.medusa",
    "EagleDrafter": "specdec.proposers.eagle.drafter",
    "train_eagle": "specdec.training.eagle",
    "hf_generate": "specdec.integrations.hf",
    "SpecCache": "specdec.model.cache",
}

__all__ = [
    "BuildInfo",
    "TypicalAcceptance",
    "PackingConfig",
    "VerificationConfig",
    "accelerate_verification",
    "pack_linear_layers",
    "build_info",
    "models",
    "ops",
    "profile_passes",
    *_LAZY,
]


@dataclass(frozen=True)
class BuildInfo:
    version: str
    torch_version: str           # the torch the extension was compiled against
    cuda_kernels: bool           # whether CUDA kernels are compiled in
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


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")
