"""Fixtures of the vLLM tests (the engines' set-up is in vllm_engines.py)."""

from __future__ import annotations

import pytest
from vllm_engines import Run, run


@pytest.fixture(scope="session")
def model_dir() -> str:
    from specdec import models

    return str(models.fetch("smollm2-135m"))


@pytest.fixture(scope="session")
def plain(model_dir: str) -> Run:
    """vLLM without speculation: the reference every speculative run must equal."""
    return run(model_dir)
