"""What the benchmark scripts share: the dtypes they take and the prepared model they run."""

from __future__ import annotations

import argparse

import specdec
import torch
from specdec import models

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def prepared_model(args: argparse.Namespace):
    """``args.threads`` set, ``args.model`` loaded in ``args.dtype`` and prepared for
    verification passes: ``(model, tokenizer)``."""
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = models.load(args.model, dtype=DTYPES[args.dtype])
    specdec.accelerate_verification(model)
    return model, tok
