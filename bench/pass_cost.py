"""Cost of one target pass over k tokens, before and after ``specdec.pack_linear_layers``, with
each of its kernels.

Loads a model (a named demo model, a path or an HF id) once as it is and once per kernel
prepared with ``PackingConfig(kernel=...)`` (specdec's ``DotLinear``, oneDNN's ``PackedLinear``),
checks that the prepared models' logits did not change (the largest difference, relative to the
largest logit, is recorded), measures ``specdec.profile_passes`` on every model in turn, round
after round (a slow spell of the machine slows them alike), prints a markdown table of the
medians and writes it with a JSON record to ``bench/results/pass_cost-<model>-<dtype>.{json,md}``.

    python bench/pass_cost.py --model qwen2.5-coder-0.5b --dtype float32
    python bench/pass_cost.py --model smollm2-135m --ks 1,2 --repeats 1   # a quick check

Run it on a quiet machine: the numbers are wall-clock medians. Holds 1 + len(kernels) copies of
the model in memory.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import specdec
import torch
import transformers
from specdec import models
from specdec.model.prepare import PackingConfig

KERNELS = {"specdec": "DotLinear", "onednn": "PackedLinear"}

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
    parser.add_argument("--kernels", default="specdec,onednn", help="comma-separated: specdec, onednn")
    parser.add_argument("--prefix-len", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5, help="rounds over every model")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    ks = tuple(int(k) for k in args.ks.split(","))
    kernels = args.kernels.split(",")
    if unknown := set(kernels) - set(KERNELS):
        parser.error(f"unknown kernels {sorted(unknown)}: choose from {sorted(KERNELS)}")
    dtype = DTYPES[args.dtype]
    torch.set_num_threads(args.threads)

    variants = {"plain": models.load(args.model, dtype=dtype)[0]}
    probe_k = max(ks)
    reference = _probe_logits(variants["plain"], probe_k, args.prefix_len)
    prepare_s, overhead, max_rel = {}, {}, {}
    for kernel in kernels:
        model = models.load(args.model, dtype=dtype)[0]
        start = time.perf_counter()
        specdec.pack_linear_layers(model, PackingConfig(kernel=kernel))
        prepare_s[kernel] = round(time.perf_counter() - start, 2)
        overhead[kernel] = specdec.model.prepare.memory_overhead(model)
        diff = _probe_logits(model, probe_k, args.prefix_len) - reference
        max_rel[kernel] = (diff.abs().max() / reference.abs().max()).item()
        variants[kernel] = model
    rounds: dict[str, list[dict[int, float]]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, model in variants.items():
            rounds[name].append(specdec.profile_passes(model, ks, prefix_len=args.prefix_len, repeats=1))
    ms = {name: {k: statistics.median(r[k] for r in rs) for k in ks} for name, rs in rounds.items()}

    record = {
        "model": args.model,
        "dtype": args.dtype,
        "ks": list(ks),
        "prefix_len": args.prefix_len,
        "repeats": args.repeats,
        "threads": args.threads,
        "cpu": _cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "ms": {name: {str(k): round(v, 2) for k, v in m.items()} for name, m in ms.items()},
        "prepare_s": prepare_s,
        "memory_overhead_bytes": overhead,
        "max_rel_logit_diff": max_rel,
        "probe_k": probe_k,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    names = ["plain", *kernels]
    header = " | ".join(["plain"] + [f"{KERNELS[k]} ({k})" for k in kernels])
    lines = [
        f"## Pass cost: {args.model}, {args.dtype}, {args.threads} threads",
        "",
        f"{record['cpu']} ({record['cpu_capability']}); torch {record['torch']}, transformers "
        f"{record['transformers']}; KV cache of {args.prefix_len} tokens; median of {args.repeats} "
        "rounds over the models (ms per pass).",
        "",
        f"| k | {header} |",
        "|---|" + "---|" * len(names),
        *(f"| {k} | " + " | ".join(f"{ms[n][k]:.1f}" for n in names) + " |" for k in ks),
        "",
        *(
            f"{KERNELS[k]}: preparing took {prepare_s[k]:.1f} s and added {overhead[k] / 2**20:.1f} MiB; "
            f"largest logit difference over a {probe_k}-token pass: {max_rel[k]:.2e} of the largest logit."
            for k in kernels
        ),
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
