"""``specdec export-vllm``: Medusa heads from ``specdec train-medusa`` in vLLM's ``medusa`` layout,
or an EAGLE drafter from ``specdec train-eagle`` in the layout of its ``eagle`` method.

Medusa heads share the target's LM head, which their directory does not hold: its rows are read
from the target's safetensors (``--target``, default: the model the heads were trained for, a
specdec demo model's name or a directory). An EAGLE drafter needs nothing of the target to be
exported; the target (the same default) is read to check that the drafter was made for it.
Prints how to serve the result.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("export-vllm", help="write Medusa heads or an EAGLE drafter in the checkpoint layout of "
                                           "vLLM's medusa or eagle method")
    what = e.add_mutually_exclusive_group(required=True)
    what.add_argument("--medusa", metavar="DIR", help="heads written by specdec train-medusa")
    what.add_argument("--eagle", metavar="DIR", help="a drafter written by specdec train-eagle (Llama or Qwen2 "
                                                     "targets)")
    e.add_argument("--out", required=True, metavar="DIR", help="where the vLLM checkpoint goes")
    e.add_argument("--target", metavar="DIR_OR_NAME",
                   help="the target model (default: the one the heads or drafter were trained for)")
    e.add_argument("--num-speculative-tokens", type=int, default=3, metavar="K",
                   help="with --eagle: the chain length in the printed serve line (default 3)")
    e.set_defaults(func=cmd_export_vllm)


def cmd_export_vllm(args: argparse.Namespace) -> None:
    if args.eagle is not None:
        _export_eagle(args)
    else:
        _export_medusa(args)


def _target_dir(target: str) -> Path:
    from specdec import models

    return models.fetch(target) if target in models.REGISTRY else Path(target)


def _export_medusa(args: argparse.Namespace) -> None:
    from specdec import MedusaHeads
    from specdec.vllm import export_medusa, lm_head_weight, medusa_engine_args

    heads = MedusaHeads.load(args.medusa)
    target = args.target or heads.config.target
    if target is None:
        raise SystemExit("specdec export-vllm: the heads do not name their target: give --target DIR")
    target_dir = _target_dir(target)
    if not target_dir.is_dir():
        raise SystemExit(f"specdec export-vllm: the target {target} is not a directory: give --target DIR")
    try:
        out = export_medusa(heads, args.out, lm_head=None if heads.config.per_head_output else lm_head_weight(target_dir))
        engine = medusa_engine_args(out, target_dir)
    except ValueError as e:
        raise SystemExit(f"specdec export-vllm: {e}") from None
    print(f"wrote {out}; serve it with:")
    print(f"  vllm serve {target_dir} --speculative-config '{json.dumps(engine['speculative_config'])}'"
          + (f" --model-loader-extra-config '{json.dumps(engine['model_loader_extra_config'])}'"
             if "model_loader_extra_config" in engine else ""))


def _export_eagle(args: argparse.Namespace) -> None:
    from specdec.vllm import eagle_engine_args, export_eagle

    drafter = Path(args.eagle)
    try:
        made_for = json.loads((drafter / "config.json").read_text()).get("target")
    except (OSError, ValueError):
        made_for = None  # export_eagle names what is missing
    target = args.target or made_for
    if target is None:
        raise SystemExit("specdec export-vllm: the drafter does not name its target: give --target DIR")
    target_dir = _target_dir(target)
    if not target_dir.is_dir():
        raise SystemExit(f"specdec export-vllm: the target {target} is not a directory: give --target DIR")
    try:
        out = export_eagle(drafter, args.out)
        engine = eagle_engine_args(out, target_dir, num_speculative_tokens=args.num_speculative_tokens)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"specdec export-vllm: {e}") from None
    print(f"wrote {out} (vLLM drafts chains of {args.num_speculative_tokens} over the target's full vocabulary); "
          f"serve it with:")
    print(f"  vllm serve {target_dir} --speculative-config '{json.dumps(engine['speculative_config'])}'")
