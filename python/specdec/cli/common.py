"""What the ``specdec`` subcommands share: model arguments and loading, prompt encoding."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from specdec.model.prepare import PackingConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="target: a named demo model, HF id or local path")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--no-accelerate", action="store_true",
                   help="do not prepack the target's linear layers for multi-token passes (CPU)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def at_least(low: int, note: str, name: str):
    """An argparse type: an int of at least ``low`` (``note``: what ``low`` means)."""
    def parse(value: str) -> int:
        n = int(value)
        if n < low:
            raise argparse.ArgumentTypeError(f"must be >= {low} ({note}), got {n}")
        return n
    parse.__name__ = name  # argparse names the type in its "invalid ... value" message
    return parse




def prompt_text(args: argparse.Namespace) -> str:
    if args.prompt_file:
        return Path(args.prompt_file).read_text()
    if args.prompt is None:
        sys.exit("specdec generate: give --prompt TEXT or --prompt-file FILE")
    return args.prompt


def load_models(args: argparse.Namespace, packing: PackingConfig | None = None):
    """The target (and the draft, if asked for) in the requested dtype, prepared unless
    --no-accelerate: the target with ``packing`` (default: for cheap, row-invariant
    verification passes), the draft for drafting. Returns (target, tokenizer, draft or None)."""
    import specdec
    from specdec import models

    if args.threads:
        torch.set_num_threads(args.threads)
    target, tokenizer = models.load(args.model, dtype=DTYPES[args.dtype])
    draft_dtype = DTYPES[args.draft_dtype or args.dtype]
    draft = models.load(args.draft, dtype=draft_dtype)[0] if args.draft else None
    if not args.no_accelerate:
        specdec.pack_linear_layers(target, packing)
        if draft is not None:
            specdec.pack_linear_layers(draft, specdec.PackingConfig.for_draft())
    return target, tokenizer, draft


CACHED = "cached"  # --medusa or --eagle without a directory


def medusa_heads(args: argparse.Namespace, target, tokenizer):
    """The heads of ``--medusa DIR``, or those cached for the model (trained on first use)."""
    import specdec
    from specdec.training.medusa import cached_heads

    if args.medusa != CACHED:
        return specdec.MedusaHeads.load(args.medusa)
    return cached_heads(target, tokenizer, f"{Path(args.model).name}-{args.dtype}")


def eagle_drafter(args: argparse.Namespace, target, tokenizer):
    """The drafter of ``--eagle DIR``, or the one cached for the model (trained on first use)."""
    import specdec
    from specdec.training.eagle import cached_eagle

    if args.eagle != CACHED:
        return specdec.EagleDrafter.load(args.eagle)
    return cached_eagle(target, tokenizer, f"{Path(args.model).name}-{args.dtype}")


def pad_token_id(tokenizer) -> int:
    """The tokenizer's padding id, else its end-of-text id."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def encode(tokenizer, text: str, chat: bool) -> torch.Tensor:
    """``[1, N]`` token ids of ``text``, wrapped in the chat template when ``chat``."""
    if chat:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True, return_tensors="pt")
        return ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    return tokenizer(text, return_tensors="pt").input_ids
