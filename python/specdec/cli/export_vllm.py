"""``specdec export-vllm``: Medusa heads from ``specdec train-medusa`` in vLLM's ``medusa`` layout.

The heads share the target's LM head, which their directory does not hold: its rows are read
from the target's safetensors (``--target``, default: the model the heads were trained for, a
specdec demo model's name or a directory). Prints how to serve the result.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("export-vllm", help="write Medusa heads in the checkpoint layout vLLM's medusa method loads")
    e.add_argument("--medusa", required=True, metavar="DIR", help="heads written by specdec train-medusa")
    e.add_argument("--out", required=True, metavar="DIR", help="where the vLLM checkpoint goes")
    e.add_argument("--target", metavar="DIR_OR_NAME",
                   help="the target model (default: the one the heads were trained for)")
    e.set_defaults(func=cmd_export_vllm)


def cmd_export_vllm(args: argparse.Namespace) -> None:
    from specdec import MedusaHeads, models
    from specdec.vllm import export_medusa, lm_head_weight, medusa_engine_args

    heads = MedusaHeads.load(args.medusa)
    target = args.target or heads.config.target
    if target is None:
        raise SystemExit("specdec export-vllm: the heads do not name their target: give --target DIR")
    target_dir = models.fetch(target) if target in models.REGISTRY else Path(target)
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
