"""An EAGLE drafter's directory as :meth:`EagleDrafter.save` writes it, read without building
the drafter (no transformers needed: the vLLM export reads it so)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import Tensor

__all__ = ["CONFIG_FILE", "FORMAT", "FORMAT_VERSION", "WEIGHTS_FILE", "read_saved"]

FORMAT = "specdec-eagle-drafter"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "drafter.safetensors"


def read_saved(directory: str | os.PathLike[str], who: str) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """The saved drafter's config (its ``config.json``) and weights; ``who`` starts the error
    messages: FileNotFoundError for a missing directory or file, ValueError for another
    format or version."""
    from safetensors.torch import load_file

    path = Path(directory)
    if not path.is_dir():
        raise FileNotFoundError(f"{who}: no {CONFIG_FILE} in {path}: it is not a directory")
    config_path, weights = path / CONFIG_FILE, path / WEIGHTS_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"{who}: no {CONFIG_FILE} in {path} (an EAGLE drafter's directory, from "
                                f"specdec train-eagle)")
    meta = json.loads(config_path.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{who}: {config_path} is not a specdec EAGLE drafter (format {meta.get('format')!r}, "
                         f"expected {FORMAT!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{who}: {path} has format version {meta.get('format_version')}; this specdec reads "
                         f"version {FORMAT_VERSION}")
    if not weights.is_file():
        raise FileNotFoundError(f"{who}: no {WEIGHTS_FILE} in {path}")
    return meta, load_file(str(weights))
