"""Batched decoding: tokens per second against batch size, ours next to HF's batched generate.

Each batch takes kinds of prompts in turn (``--kinds``; default: code generation, code editing,
whose answer copies the prompt, and short chat questions; ``short``: questions answered in a
few tokens); rows are left-padded as for batched generation.
For each batch size, interleaved: HF ``generate`` (batched, greedy), our ``method=None`` (one
token per pass; also with stopped rows kept in every pass, ``drop_finished=False``, as HF does),
and each method given; every output is checked identical to our one-token decoding of the same
batch. Writes ``bench/results/batch_sizes-<model>-<dtype>[-<tag>].{json,md,png}``.

    python bench/batch_sizes.py --model qwen2.5-coder-0.5b --sizes 1,2,4,8,16
    python bench/batch_sizes.py --model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
        --methods prompt_lookup,draft --sizes 1,2,4,8   # DraftModel: the draft in bf16, head 65536

With ``--queue N``: a queue of N such prompts served B rows at a time, for each B of
``--sizes``: HF ``generate`` over consecutive batches of B (static batching: a batch ends with
its last row), ours with ``max_batch_size=B`` (continuous batching: a waiting prompt takes the
place of a row as soon as it stops).

    python bench/batch_sizes.py --model qwen2.5-coder-0.5b --queue 24 --sizes 4,8 --tag queue24

Run it on an idle machine: the numbers are wall-clock, ratios from one run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import specdec
import torch
from prepared import DTYPES
from specdec.cli.bench import EDITING_PROMPTS, GENERATION_PROMPTS
from specdec.cli.common import encode, load_models, pad_token_id
from specdec import Batching

CHAT_PROMPTS = ["What is the difference between a list and a tuple in Python?",
                "Name three sorting algorithms and when to use each."]
# Each takes the draft model (``--draft``; None without it).
METHODS = {"prompt_lookup": lambda draft: specdec.PromptLookup(), "lookahead": lambda draft: specdec.Lookahead(),
           "draft": lambda draft: specdec.DraftModel(draft, num_draft_tokens=8, adaptive=True, draft_vocab_size=65536)}
KEPT = {"drop_finished": False}


# Questions answered in a few tokens: rows that stop long before the others.
SHORT_PROMPTS = ["Answer with one number only: what is 17 + 25?",
                 "Answer with one word only: which Python keyword defines a function?",
                 "Answer yes or no only: is a Python tuple mutable?",
                 "Answer with one word only: which built-in gives the length of a list?"]
KINDS = {"generation": GENERATION_PROMPTS, "editing": EDITING_PROMPTS, "chat": CHAT_PROMPTS,
         "short": SHORT_PROMPTS}


def mixed_prompts(n: int, kinds: list[str]) -> list[str]:
    """n prompts taking the kinds in turn (e.g. generation, editing, chat, generation, ...)."""
    sets = [KINDS[k] for k in kinds]
    return [sets[i % len(sets)][(i // len(sets)) % len(sets[i % len(sets)])] for i in range(n)]


def batch(tok, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and attention mask of the prompts as chat turns."""
    rows = [encode(tok, p, chat=True)[0] for p in prompts]
    S = max(len(r) for r in rows)
    pad = pad_token_id(tok)
    ids = torch.stack([torch.cat([torch.full((S - len(r),), pad), r]) for r in rows])
    mask = torch.stack([torch.cat([torch.zeros(S - len(r), dtype=torch.long), torch.ones(len(r), dtype=torch.long)])
                        for r in rows])
    return ids, mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--sizes", default="1,2,4,8,16")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--methods", default="prompt_lookup,lookahead",
                        help=f"of {sorted(METHODS)} (draft: with --draft)")
    parser.add_argument("--draft", default=None, help="draft model of the draft method, prepared for drafting")
    parser.add_argument("--draft-dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--tag", default="", help="appended to the result files' names")
    parser.add_argument("--kinds", default="generation,editing,chat",
                        help=f"prompt kinds taken in turn, of {sorted(KINDS)}")
    parser.add_argument("--queue", type=int, default=None,
                        help="a queue of this many prompts served --sizes rows at a time")
    parser.add_argument("--distinct", action="store_true",
                        help="number each prompt at its start ('Request i: ...'), so that no two are the same")
    parser.set_defaults(no_accelerate=False)  # load_models prepares both models unless asked not to
    args = parser.parse_args()
    names = [m for m in args.methods.split(",") if m]
    if "draft" in names and not args.draft:
        raise SystemExit("batch_sizes.py: the draft method needs --draft MODEL")
    model, tok, draft = load_models(args)  # both prepared, the draft for drafting (as the CLI does)
    pad = pad_token_id(tok)
    # One-token decoding with stopped rows kept in every pass (drop_finished=False): what
    # dropping them buys.
    kept = {} if args.queue else {"specdec_one_token_kept": (lambda: None, KEPT)}  # rows must leave a queue
    methods = {"specdec_one_token": (lambda: None, {}), **kept,
               **{f"specdec_{m}": (lambda m=m: METHODS[m](draft), {}) for m in names}}
    kinds = args.kinds.split(",")
    ids, mask = batch(tok, mixed_prompts(2, kinds))  # warm-up: first passes pay for kernel generation
    model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=pad)
    for make, kw in methods.values():
        specdec.generate(model, ids, attention_mask=mask, max_new_tokens=4, method=make(), pad_token_id=pad, **kw)
    rows = []
    for B in [int(b) for b in args.sizes.split(",")]:
        prompts = mixed_prompts(args.queue or B, kinds)
        if args.distinct:  # the sets repeat prompts: requests then share only the chat template's start
            prompts = [f"Request {i}: {p}" for i, p in enumerate(prompts)]
        ids, mask = batch(tok, prompts)
        N, secs, hf_new = args.new_tokens, 0.0, 0
        for first in range(0, len(prompts), B):  # a queue: HF's static batches, one after the other
            hf_ids, hf_mask = batch(tok, prompts[first: first + B])
            start = time.perf_counter()
            with torch.inference_mode():
                hf = model.generate(hf_ids, attention_mask=hf_mask, max_new_tokens=N, do_sample=False,
                                    pad_token_id=pad, temperature=None, top_k=None, top_p=None)
            secs += time.perf_counter() - start
            hf_new += int((hf[:, hf_ids.shape[1]:] != pad).sum())
        rows.append({"batch": B, "method": "hf_batched", "tokens": hf_new, "seconds": secs,
                     "tok/s": hf_new / secs, "passes": None, "= one-token": None})
        reference = None
        for name, (make, kw) in methods.items():
            out = specdec.generate(model, ids, attention_mask=mask, max_new_tokens=N, method=make(), pad_token_id=pad,
                                   batching=Batching(max_batch_size=B if args.queue else None), **kw)
            st = out.stats
            reference = out.sequences if reference is None else reference
            rows.append({"batch": B, "method": name, "tokens": st.new_tokens, "seconds": st.wall_time_s,
                         "tok/s": st.tokens_per_second, "passes": st.target_forwards,
                         "= one-token": torch.equal(out.sequences, reference)})
        print("\n".join(_table([r for r in rows if r["batch"] == B]).splitlines()[2:]), flush=True)
    _write(args, rows)


def _table(rows: list[dict]) -> str:
    lines = ["| batch | method | tokens | tok/s | vs HF batched | target passes | = one-token |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        hf = next(x for x in rows if x["batch"] == r["batch"] and x["method"] == "hf_batched")
        same = {None: "", True: "yes", False: "NO"}[r["= one-token"]]
        lines.append(f"| {r['batch']} | {r['method']} | {r['tokens']} | {r['tok/s']:.1f} "
                     f"| {r['tok/s'] / hf['tok/s']:.2f}x | {r['passes'] or ''} | {same} |")
    return "\n".join(lines)


def _write(args, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"batch_sizes-{Path(args.model).name}-{args.dtype}" + (f"-{args.tag}" if args.tag else "")
    meta = {"model": args.model, "dtype": args.dtype, "new_tokens": args.new_tokens, "tag": args.tag, "queue": args.queue,
            "distinct": args.distinct,
            "kinds": args.kinds, "draft": args.draft, "draft_dtype": args.draft_dtype if args.draft else None,
            "threads": torch.get_num_threads()}
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / f"{stem}.md").write_text(_table(rows) + "\n")
    print(_table(rows))
    fig, ax = plt.subplots(figsize=(6, 4))
    for method in dict.fromkeys(r["method"] for r in rows):
        rs = [r for r in rows if r["method"] == method]
        ax.plot([r["batch"] for r in rs], [r["tok/s"] for r in rs], marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"rows at once (a queue of {args.queue} mixed prompts)" if args.queue else "batch size (mixed prompts)")
    ax.set_ylabel("tokens per second")
    ax.set_title(f"{args.model} {args.dtype}, {args.new_tokens} new tokens, greedy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=110)


if __name__ == "__main__":
    main()
