"""Cost of one verification pass over B rows x k nodes: what a batch's candidates cost.

Each pass is what the verify loop runs: `specdec.tree_forward` on a `SpecCache` whose rows hold
``--prefix-len`` committed tokens, over a chain of k nodes per row (rectangular: every row at
the same width, as the loop's passes are). Prints a markdown table (ms, median of ``--repeats``
passes) and writes it with a JSON record to
``bench/results/batch_pass_cost-<model>-<dtype>.{json,md}``.

    python bench/batch_pass_cost.py --model qwen2.5-coder-0.5b --rows 1,2,4,8 --ks 1,2,4,8
    python bench/batch_pass_cost.py --model qwen2.5-7b --random-weights --device cuda --dtype bfloat16

``--random-weights`` builds the model from ``bench/configs/<model>.json`` (an architecture, no
weights: the cost does not depend on them) for machines without the model files. Run it on a
quiet machine: the numbers are wall-clock medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from prepared import DTYPES, prepared_model
from specdec.model.cache import SpecCache
from specdec.model.attention import tree_attention_enabled
from specdec.model.forward import tree_forward
from specdec.model.prefill import prefill


@torch.inference_mode()
def pass_ms(model, rows: int, ks: list[int], prefix_len: int, repeats: int,
            long_rows: int | None = None) -> dict[int, float]:
    """ms (median) of a pass over ``rows`` x k chain nodes after ``prefix_len`` committed tokens;
    with ``long_rows``, a packed pass where only that many rows have k nodes, the others their
    root alone (`tree_forward`'s ``widths``)."""
    gen = torch.Generator().manual_seed(0)
    vocab, device = model.config.vocab_size, model.device
    cache = SpecCache.for_model(model, batch_size=rows, max_length=prefix_len + max(ks))
    prefill(model, cache, torch.randint(vocab, (rows, prefix_len), generator=gen).to(device),
            torch.full((rows,), prefix_len, device=device))
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    out = {}
    for k in ks:
        tokens = torch.randint(vocab, (rows, k), generator=gen).to(device)
        parents = torch.arange(-1, k - 1, device=device).expand(rows, k)
        widths = None
        if long_rows is not None:
            widths = torch.ones(rows, dtype=torch.long, device=device)
            widths[:long_rows] = k
        tree_forward(model, cache, tokens, parents, widths=widths)  # unmeasured: lazily initialised paths
        times = []
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            tree_forward(model, cache, tokens, parents, widths=widths)  # writes after the prefix, commits nothing
            sync()
            times.append((time.perf_counter() - start) * 1e3)
        out[k] = statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--rows", default="1,2,4,8,16", help="comma-separated batch sizes")
    parser.add_argument("--ks", default="1,2,4,8", help="comma-separated nodes per row")
    parser.add_argument("--prefix-len", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--random-weights", action="store_true",
                        help="build --model from bench/configs/<model>.json (or a config.json path) with random weights")
    parser.add_argument("--long-rows", type=int, default=None,
                        help="packed passes where only this many rows have k nodes, the others one")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    model, _ = prepared_model(args)
    rows = [int(b) for b in args.rows.split(",")]
    ks = [int(k) for k in args.ks.split(",")]
    with tree_attention_enabled(model):
        ms = {b: pass_ms(model, b, ks, args.prefix_len, args.repeats, args.long_rows) for b in rows}
    where = (torch.cuda.get_device_name(model.device) if model.device.type == "cuda"
             else f"{torch.get_num_threads()} threads")
    weights = ", random weights" if args.random_weights else ""
    shape = "B rows x k nodes" if args.long_rows is None else f"B rows, {args.long_rows} of k nodes and the rest of one, packed"
    lines = [f"## Verification pass over {shape}: {args.model}{weights}, {args.dtype}, {where}", "",
             f"Prepared model (CPU), {args.prefix_len} committed tokens per row, median of {args.repeats} passes (ms); "
             "in brackets the ratio to one row's one-token pass.", "",
             "| rows | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    one = ms[rows[0]][ks[0]]
    lines += [f"| {b} | " + " | ".join(f"{ms[b][k]:.0f} ({ms[b][k] / one:.2f}x)" for k in ks) + " |" for b in rows]
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = (f"batch_pass_cost-{Path(args.model).name}-{args.dtype}" + ("-cuda" if model.device.type == "cuda" else "")
            + ("" if args.long_rows is None else f"-packed{args.long_rows}"))
    record = {"model": args.model, "dtype": args.dtype, "prefix_len": args.prefix_len, "repeats": args.repeats,
              "threads": torch.get_num_threads(), "torch": torch.__version__, "device": where,
              "random_weights": args.random_weights, "long_rows": args.long_rows,
              "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "ms": {str(b): {str(k): round(v, 2) for k, v in r.items()} for b, r in ms.items()}}
    (args.out / f"{stem}.json").write_text(json.dumps(record, indent=1))
    (args.out / f"{stem}.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
