"""Cost of one target pass over k tokens, before and after ``specdec.pack_linear_layers``.

Loads a model (a named demo model, a path or an HF id), measures ``specdec.profile_passes`` on
the plain model, prepares it, checks that its logits did not change (fp32: 1e-5 relative to the
largest logit), measures again, prints a markdown table and writes it with a JSON record to
``bench/results/pass_cost-<model>-<dtype>.{json,md}``.

    python bench/pass_cost.py --model qwen2.5-coder-1.5b --dtype float32
    python bench/pass_cost.py --model smollm2-135m --ks 1,2 --repeats 1   # a quick check

Run it on a quiet machine: the numbers are wall-clock medians.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import specdec
import torch
import transformers
from specdec import models

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@torch.inference_mode()
def _probe_logits(model: torch.nn.Module, k: int, prefix_len: int) -> torch.Tensor:
    """Logits of a pass over k tokens after a prefix, through a KV cache (as verification runs)."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(model.config.vocab_size, (1, prefix_len + k), generator=gen)
    cache = transformers.DynamicCache(config=model.config)
    model(input_ids=ids[:, :prefix_len], cache=cache, use_cache=True)
    return model(input_ids=ids[:, prefix_len:], cache=cache, use_cache=True).logits.float()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument(
        "--ks", default="1,2,4,8,16,32,64", help="comma-separated numbers of tokens per pass"
    )
    parser.add_argument("--prefix-len", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    ks = tuple(int(k) for k in args.ks.split(","))
    dtype = DTYPES[args.dtype]
    torch.set_num_threads(args.threads)

    model, _ = models.load(args.model, dtype=dtype)
    probe_k = max(ks)
    reference = _probe_logits(model, probe_k, args.prefix_len)
    before = specdec.profile_passes(model, ks, prefix_len=args.prefix_len, repeats=args.repeats)
    start = time.perf_counter()
    specdec.pack_linear_layers(model)
    prepare_s = time.perf_counter() - start
    max_rel = (
        (_probe_logits(model, probe_k, args.prefix_len) - reference).abs().max()
        / reference.abs().max()
    ).item()
    after = specdec.profile_passes(model, ks, prefix_len=args.prefix_len, repeats=args.repeats)

    record = {
        "model": args.model,
        "dtype": args.dtype,
        "ks": list(ks),
        "prefix_len": args.prefix_len,
        "repeats": args.repeats,
        "threads": args.threads,
        "cpu": _cpu_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "before_ms": {str(k): round(v, 2) for k, v in before.items()},
        "after_ms": {str(k): round(v, 2) for k, v in after.items()},
        "prepare_s": round(prepare_s, 2),
        "memory_overhead_bytes": specdec.model.prepare.memory_overhead(model),
        "max_rel_logit_diff": max_rel,
        "probe_k": probe_k,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    lines = [
        f"## Pass cost: {args.model}, {args.dtype}, {args.threads} threads",
        "",
        f"{record['cpu']}; torch {record['torch']}, transformers {record['transformers']}; "
        f"KV cache of "
        f"{args.prefix_len} tokens; median of {args.repeats} passes (ms).",
        "",
        f"| k | plain | prepacked | speedup | prepacked / plain at k={ks[0]} |",
        "|---|---|---|---|---|",
        *(
            f"| {k} | {before[k]:.1f} | {after[k]:.1f} | {before[k] / after[k]:.2f}x "
            f"| {after[k] / before[ks[0]]:.2f} |"
            for k in ks
        ),
        "",
        f"Preparing took {prepare_s:.1f} s and added "
        f"{record['memory_overhead_bytes'] / 2**20:.1f} MiB; largest logit "
        f"difference over a {probe_k}-token pass: {max_rel:.2e} of the largest logit.",
    ]
    table = "\n".join(lines) + "\n"
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    # Model names hold dots ("qwen2.5-..."): build the names, no with_suffix.
    stem = f"pass_cost-{args.model.replace('/', '_')}-{args.dtype}"
    (args.out / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(table)
    print(f"wrote {stem}.json and {stem}.md")


if __name__ == "__main__":
    main()
