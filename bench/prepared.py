"""What the benchmark scripts share: the dtypes they take and the prepared model they run."""

from __future__ import annotations

import argparse
from pathlib import Path

import specdec
import torch
from specdec import models

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Architectures (config.json contents) to build with random weights where the model files are
# not at hand (a GPU machine without network): a pass's cost does not depend on the weights.
CONFIGS = Path(__file__).parent / "configs"


def random_model(name: str, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """A causal LM of the architecture ``bench/configs/<name>.json`` (or a config.json path),
    random weights, built on ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = CONFIGS / f"{name}.json"
    if not path.is_file():
        path = Path(name)
    if not path.is_file():
        known = sorted(p.stem for p in CONFIGS.glob("*.json"))
        raise SystemExit(f"--random-weights: no config {name!r}: give a config.json path or one of {known}")
    config = AutoConfig.from_pretrained(path)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def prepared_model(args: argparse.Namespace):
    """``args.threads`` set, ``args.model`` loaded in ``args.dtype`` on ``args.device`` (default
    CPU; with ``args.random_weights`` built from its architecture alone, no tokenizer) and
    prepared for verification passes: ``(model, tokenizer)``."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = getattr(args, "device", "cpu"), DTYPES[args.dtype]
    if getattr(args, "random_weights", False):
        model, tok = random_model(args.model, dtype, device), None
    else:
        model, tok = models.load(args.model, dtype=dtype, device=device)
    specdec.pack_linear_layers(model)  # CPU only: elsewhere the model is left as it is
    return model, tok
