"""Long prompts: the prompt's pass (prefill) and end-to-end decoding, ours next to HF's.

The prompt is Python source from the standard library (a whole module to edit), cut to N tokens
and wrapped as a chat turn. For each N, interleaved, ``--repeats`` times: HF ``generate`` with one
new token and ``specdec.generate`` with one new token (both: the prefill plus one choice), then,
with ``--new-tokens``, plain HF decoding, HF prompt lookup, our ``method=None`` and our
PromptLookup, all greedy and checked identical. Writes
``bench/results/long_prompt-<model>-<dtype>[-new<N>].{json,md}``.

    python bench/long_prompt.py --model qwen2.5-coder-0.5b --lengths 500,2000,4000,8000

Run it on an idle machine: the numbers are wall-clock, ratios from one run.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time
from pathlib import Path

import specdec
import torch
from prepared import DTYPES, prepared_model



def long_prompt(tok, n: int) -> torch.Tensor:
    import argparse as source_a
    import inspect as source_b
    import typing as source_c

    source = "\n".join(inspect.getsource(m) for m in (source_a, source_b, source_c))
    body = tok(source).input_ids
    text = tok.decode(body[:n])
    turn = [{"role": "user", "content": "Add type hints to this module and return it in full:\n\n" + text}]
    ids = tok.apply_chat_template(turn, add_generation_prompt=True, return_tensors="pt")
    return ids if isinstance(ids, torch.Tensor) else ids["input_ids"]


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--lengths", default="500,2000,4000,8000")
    parser.add_argument("--new-tokens", type=int, default=0, help="also decode this many tokens (0: prefill only)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    model, tok = prepared_model(args)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def hf(ids, new, **kw):
        with torch.inference_mode():
            return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                  do_sample=False, temperature=None, top_k=None, top_p=None,
                                  pad_token_id=pad, **kw)[0, ids.shape[1]:]

    def ours(ids, new, method=None):
        out = specdec.generate(model, ids, max_new_tokens=new, method=method, pad_token_id=pad)
        return out.sequences[0, ids.shape[1]: ids.shape[1] + out.stats.new_tokens]

    warm = long_prompt(tok, 64)
    hf(warm, 2), ours(warm, 2)
    rows = []
    for n in [int(x) for x in args.lengths.split(",")]:
        ids = long_prompt(tok, n)
        times: dict[str, list[float]] = {}
        same = True
        for _ in range(args.repeats):
            runs = {"hf prefill": lambda: hf(ids, 1), "specdec prefill": lambda: ours(ids, 1)}
            if args.new_tokens:
                runs |= {
                    "hf plain": lambda: hf(ids, args.new_tokens),
                    "hf prompt lookup": lambda: hf(ids, args.new_tokens, prompt_lookup_num_tokens=10),
                    "specdec plain": lambda: ours(ids, args.new_tokens),
                    "specdec prompt lookup": lambda: ours(ids, args.new_tokens, specdec.PromptLookup()),
                }
            outs = {}
            for name, fn in runs.items():
                outs[name], secs = timed(fn)
                times.setdefault(name, []).append(secs)
            reference = outs.get("hf plain", outs["hf prefill"])
            same &= all(torch.equal(o, reference[: len(o)]) for o in outs.values())
        row = {"prompt_tokens": ids.shape[1], "identical": same,
               **{name: statistics.median(t) for name, t in times.items()}}
        row["prefill ratio (ours/hf)"] = row["specdec prefill"] / row["hf prefill"]
        if args.new_tokens:
            for name in ("hf plain", "hf prompt lookup", "specdec plain", "specdec prompt lookup"):
                row[f"{name} tok/s"] = args.new_tokens / row[name]
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"long_prompt-{Path(args.model).name}-{args.dtype}" + (f"-new{args.new_tokens}" if args.new_tokens else "")
    meta = {"model": args.model, "dtype": args.dtype, "threads": torch.get_num_threads(),
            "repeats": args.repeats, "new_tokens": args.new_tokens}
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        lines.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
