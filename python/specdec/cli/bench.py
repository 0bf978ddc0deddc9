"""``specdec bench``: our decoders next to plain generation and HF's assisted and prompt-lookup
generation, on the same prompts, machine and run (greedy). Writes a markdown table, JSON and a
PNG plot under ``--out``. The prompts are two built-in sets (code generation, code editing) or
the sets of a ``--prompt-file`` (``load_prompts``); with several sets, a "mixed" row per method
sums them all (a workload of several kinds of prompts).

Every method runs on the same (prepared, unless ``--no-accelerate``) target, so the plain
baseline gets the same fast one-token pass as the decoders.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

# Code generation: drafting helps, the output does not copy the prompt.
GENERATION_PROMPTS = [
    "Write a Python function quicksort(items) that returns a sorted copy of a list, with a docstring.",
    "Write a Python class LRUCache with get(key) and put(key, value) methods and a fixed capacity.",
    "Write a Python function that parses a CSV line with quoted fields and returns the list of fields.",
    "Write a Python function is_prime(n) and use it to print the primes below 100.",
]

_RENAME_SOURCE = """def summarize(records):
    totals = {}
    counts = {}
    for record in records:
        name = record["name"]
        value = record["value"]
        if name not in totals:
            totals[name] = 0
            counts[name] = 0
        totals[name] = totals[name] + value
        counts[name] = counts[name] + 1
    result = []
    for name in totals:
        average = totals[name] / counts[name]
        result.append({"name": name, "total": totals[name], "average": average})
    return result
"""

_TYPE_HINTS_SOURCE = """def read_config(path, defaults=None, required=()):
    config = dict(defaults or {})
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"{path}:{number}: expected key = value")
            key, value = line.split("=", 1)
            key, value = key.strip(), value.strip()
            if value.isdigit():
                value = int(value)
            elif value.lower() in ("true", "false"):
                value = value.lower() == "true"
            config[key] = value
    missing = [key for key in required if key not in config]
    if missing:
        raise KeyError("missing settings: " + ", ".join(missing))
    return config
"""

_REFACTOR_SOURCE = """def order_report(orders):
    by_customer = {}
    for order in orders:
        customer = order["customer"]
        if customer not in by_customer:
            by_customer[customer] = []
        by_customer[customer].append(order)
    report = []
    for customer in sorted(by_customer):
        customer_orders = by_customer[customer]
        total = 0
        largest = None
        for order in customer_orders:
            amount = order["quantity"] * order["unit_price"]
            total = total + amount
            if largest is None or amount > largest:
                largest = amount
        report.append((customer, len(customer_orders), round(total, 2), largest))
    return report
"""

_DOCSTRING_SOURCE = """def paginate(items, page, per_page=20, max_per_page=100):
    if per_page < 1 or per_page > max_per_page:
        raise ValueError(f"per_page must be between 1 and {max_per_page}")
    total = len(items)
    pages = max(1, (total + per_page - 1) // per_page)
    if page < 1 or page > pages:
        raise IndexError(f"page {page} is out of range 1..{pages}")
    start = (page - 1) * per_page
    end = min(start + per_page, total)
    return {
        "items": items[start:end],
        "page": page,
        "per_page": per_page,
        "total": total,
        "pages": pages,
        "has_previous": page > 1,
        "has_next": page < pages,
    }
"""

# Code editing: the answer repeats most of the prompt, which prompt lookup can copy.
EDITING_PROMPTS = [
    "Rename the variable `records` to `rows` in this function and return the full function:\n\n"
    + _RENAME_SOURCE,
    "Add type hints to this function and return the full function:\n\n" + _TYPE_HINTS_SOURCE,
    "Rewrite this function to use collections.defaultdict and return the full function:\n\n"
    + _REFACTOR_SOURCE,
    "Add a docstring to this function and return the full function:\n\n" + _DOCSTRING_SOURCE,
]


def load_prompts(path: str | Path) -> dict[str, list[str]]:
    """The prompt sets of a ``--prompt-file``, in the order they first appear.

    A ``.jsonl`` file holds one JSON object per line, ``{"prompt": "...", "set": "..."}``
    ("set" optional, default "custom"). Any other file holds one prompt per line, all in the
    set "custom": ``\\n`` in a line stands for a newline, ``\\\\`` for one backslash. Blank
    lines are skipped in both. Raises ValueError (with the line number) on a malformed line
    or a file without prompts.
    """
    path = Path(path)
    jsonl = path.suffix.lower() == ".jsonl"
    sets: dict[str, list[str]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        if not jsonl:
            sets.setdefault("custom", []).append(
                re.sub(r"\\([\\n])", lambda m: "\n" if m[1] == "n" else "\\", line))
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not valid JSON ({e.msg})") from None
        if not isinstance(item, dict):
            raise ValueError(f"{path}:{number}: expected an object with a \"prompt\"")
        prompt, set_name = item.get("prompt"), item.get("set", "custom")
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"{path}:{number}: \"prompt\" must be a non-empty string")
        if not isinstance(set_name, str) or not set_name:
            raise ValueError(f"{path}:{number}: \"set\" must be a non-empty string")
        sets.setdefault(set_name, []).append(prompt)
    if not sets:
        raise ValueError(f"{path}: no prompts")
    return sets


@dataclass
class Run:
    prompt_set: str
    prompt: int
    method: str
    new_tokens: int
    seconds: float
    tokens_per_second: float
    identical_to_plain: bool
    target_passes: int | None = None
    tokens_per_pass: float | None = None
    acceptance_rate: float | None = None
    greedy_prefix: float | None = None  # share of the tokens before the first difference from plain
    identical_to_one_token: bool | None = None  # ours: the same tokens as our method=None


def _greedy_prefix(out: torch.Tensor, reference: torch.Tensor) -> float:
    n = min(len(out), len(reference))
    differ = (out[:n] != reference[:n]).nonzero()
    same = int(differ[0, 0]) if len(differ) else n
    return same / max(1, len(reference))


def _hf_run(model, ids, max_new, **kw):
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                             do_sample=False, temperature=None, top_k=None, top_p=None, **kw)
    return out[0, ids.shape[1]:], time.perf_counter() - start


def main(args: argparse.Namespace) -> None:
    import importlib.util

    # Both checks before the models load and the long runs start, not after.
    if args.prompt_file:
        try:
            sets = load_prompts(args.prompt_file)
        except (OSError, ValueError) as e:  # ValueError includes UnicodeDecodeError
            raise SystemExit(f"specdec bench: --prompt-file: {e}") from None
    else:
        sets = {"generation": GENERATION_PROMPTS, "editing": EDITING_PROMPTS}
    if importlib.util.find_spec("matplotlib") is None:
        raise SystemExit("specdec bench: the plot needs matplotlib: pip install 'specdec[bench]'")
    import specdec
    from specdec.cli.common import DTYPES, eagle_drafter, encode, load_models, medusa_heads, pad_token_id

    target, tok, draft = load_models(args)
    # HF plain generate in another dtype too (e.g. fp32 next to a bf16 run), prepared alike.
    others = {}
    if args.plain_dtype and args.plain_dtype != args.dtype:
        from specdec import models

        other = models.load(args.model, dtype=DTYPES[args.plain_dtype])[0]
        others[f"plain_{args.plain_dtype}"] = other if args.no_accelerate else specdec.pack_linear_layers(other)
    # With --defaults, no profile: every method prices passes from what it measures.
    costs = {} if args.defaults else specdec.profile_passes(target, ks=(1, 2, 4, 8, 16, 32))
    pad = pad_token_id(tok)
    # One short unmeasured run of every method first: the first passes of a process pay for
    # oneDNN's kernel generation and first touches of memory, which would count against
    # whichever method ran first.
    hf = {"hf_prompt_lookup": dict(prompt_lookup_num_tokens=10)}
    # Our methods: name -> (method, extra generate arguments).
    # One-token decoding through our loop: the reference every method must equal, in any dtype.
    ours = {"specdec_one_token": (None, {}), "specdec_prompt_lookup": (specdec.PromptLookup(), {}),
            "specdec_lookahead": (specdec.Lookahead(), {})}
    if args.medusa:
        heads = medusa_heads(args, target, tok)
        ours["specdec_medusa"] = (specdec.Medusa(heads), {})
        # Typical acceptance is lossy: sampled at --typical-temperature, next to exact sampling
        # at that temperature, so the drift from greedy due to sampling alone shows too.
        sampled = dict(do_sample=True, temperature=args.typical_temperature)
        if args.typical_sweep:
            ours["specdec_medusa_sampled"] = (specdec.Medusa(heads), sampled)
        for eps in args.typical_sweep:
            ours[f"specdec_medusa_typical{eps:g}"] = (
                specdec.Medusa(heads), dict(sampled, typical=specdec.TypicalAcceptance(eps)))
    if args.eagle:
        drafter = eagle_drafter(args, target, tok)
        ours["specdec_eagle"] = (specdec.Eagle(drafter), {})
        # Prompt lookup copies the names a drafter's reduced vocabulary leaves out.
        ours["specdec_eagle_hybrid"] = (specdec.Ensemble(specdec.PromptLookup(), specdec.Eagle(drafter)), {})
    if draft is not None:
        hf["hf_assisted"] = dict(assistant_model=draft)
        # With --defaults every DraftModel as a user calls it, else with fixed settings.
        # Chains drafted token by token (lookup=0), then taking copies (the default for one row).
        fixed = {} if args.defaults else dict(num_draft_tokens=8, adaptive=True, lookup=0)
        head = args.draft_vocab_size or None  # 0: the full head
        ours["specdec_draft"] = (specdec.DraftModel(draft, **fixed), {})
        if head:
            ours[f"specdec_draft_head{head}"] = (specdec.DraftModel(draft, **fixed, draft_vocab_size=head), {})
        for k in args.draft_trees:  # lookup's default (None): an adaptive tree's chain steps copy
            ours[f"specdec_draft_tree{k}"] = (specdec.DraftModel(
                draft, **dict(fixed, lookup=None), draft_vocab_size=head, tree="dynamic", top_k=k), {})
        # Without --defaults, the draft taking copies: its own row, and the hybrid's draft.
        copying = {} if args.defaults else dict(fixed, lookup=8, draft_vocab_size=head)
        if not args.defaults:
            ours["specdec_draft_lookup"] = (specdec.DraftModel(draft, **copying), {})
        # Prompt lookup's candidates first, the draft where they do not pay (without --defaults:
        # the reduced head if asked, taking copies as specdec_draft_lookup does).
        ours["specdec_hybrid"] = (specdec.Ensemble(specdec.PromptLookup(), specdec.DraftModel(draft, **copying)), {})
    if args.methods:
        unknown = set(args.methods) - {"plain", *hf, *ours, *others}
        if unknown:
            raise SystemExit(f"specdec bench: --methods: no such rows {sorted(unknown)}; "
                             f"choose from {sorted({*hf, *ours, *others})}")
        hf = {k: v for k, v in hf.items() if k in args.methods}
        ours = {k: v for k, v in ours.items() if k in args.methods}
        others = {k: v for k, v in others.items() if k in args.methods}
    # The longest measured prompt, so the warm-up's prefill is as long as any measured one.
    warm = encode(tok, max((p for ps in sets.values() for p in ps[: args.prompts]), key=len),
                   chat=True)
    _hf_run(target, warm, 8, pad_token_id=pad)
    for other in others.values():
        _hf_run(other, warm, 8, pad_token_id=pad)
    for kw in hf.values():
        _hf_run(target, warm, 8, pad_token_id=pad, **kw)
    for method, kw in ours.values():  # also makes a reduced draft head, once
        specdec.generate(target, warm, max_new_tokens=8, method=method, pad_token_id=pad, **kw)
    runs: list[Run] = []
    for set_name, prompts in sets.items():
        for i, text in enumerate(prompts[: args.prompts]):
            ids = encode(tok, text, chat=True)
            reference = one_token = None
            for _ in range(args.repeats):  # methods interleaved: slow phases of the VM hit all
                plain, secs = _hf_run(target, ids, args.max_new_tokens, pad_token_id=pad)
                reference = plain if reference is None else reference
                runs.append(Run(set_name, i, "plain", len(plain), secs, len(plain) / secs,
                                torch.equal(plain, reference)))
                for name, other in others.items():
                    out, secs = _hf_run(other, ids, args.max_new_tokens, pad_token_id=pad)
                    runs.append(Run(set_name, i, name, len(out), secs, len(out) / secs,
                                    torch.equal(out, reference)))
                for name, kw in hf.items():
                    out, secs = _hf_run(target, ids, args.max_new_tokens, pad_token_id=pad, **kw)
                    runs.append(Run(set_name, i, name, len(out), secs, len(out) / secs,
                                    torch.equal(out, reference)))
                for name, (method, kw) in ours.items():
                    seed = {"generator": torch.Generator().manual_seed(0)} if kw.get("do_sample") else {}
                    res = specdec.generate(target, ids, max_new_tokens=args.max_new_tokens,
                                           method=method, pad_token_id=pad, pass_costs=costs or None,
                                           **kw, **seed)
                    st = res.stats
                    out = res.sequences[0, ids.shape[1]: ids.shape[1] + st.new_tokens]
                    if method is None and one_token is None:
                        one_token = out
                    runs.append(Run(set_name, i, name, st.new_tokens, st.wall_time_s,
                                    st.tokens_per_second, torch.equal(out, reference),
                                    st.target_forwards, st.new_tokens / st.target_forwards,
                                    st.acceptance_rate, _greedy_prefix(out, reference),
                                    None if kw.get("do_sample") or one_token is None
                                    else torch.equal(out, one_token)))
            print(_table([r for r in runs if r.prompt_set == set_name and r.prompt == i]), flush=True)
    _write(args, runs, costs)


MIXED = "mixed"  # every set's prompts together (a workload of several kinds of prompts)


def _summary(runs: list[Run]) -> list[dict]:
    rows = []
    sets = list(dict.fromkeys(r.prompt_set for r in runs))
    for set_name in sets + ([MIXED] if len(sets) > 1 else []):
        in_set = [r for r in runs if set_name in (MIXED, r.prompt_set)]
        plain = [r for r in in_set if r.method == "plain"]
        base = sum(r.new_tokens for r in plain) / sum(r.seconds for r in plain)
        for method in dict.fromkeys(r.method for r in runs):
            rs = [r for r in in_set if r.method == method]
            rate = sum(r.new_tokens for r in rs) / sum(r.seconds for r in rs)
            passes = [r.target_passes for r in rs if r.target_passes]
            rows.append({
                "set": set_name, "method": method, "tok/s": rate, "speed-up": rate / base,
                "tokens/pass": sum(r.new_tokens for r in rs) / sum(passes) if passes else None,
                "acceptance": (sum(r.acceptance_rate for r in rs) / len(rs)) if passes else None,
                "identical": all(r.identical_to_plain for r in rs),
                "= one-token": (all(r.identical_to_one_token for r in rs)
                                if all(r.identical_to_one_token is not None for r in rs) else None),
                "greedy prefix": (sum(r.greedy_prefix for r in rs) / len(rs)) if passes else None,
            })
    return rows


def _table(runs: list[Run]) -> str:
    lines = ["| set | method | tok/s | speed-up | tokens/pass | acceptance | identical | = one-token "
             "| greedy prefix |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in _summary(runs):
        tpp = f"{s['tokens/pass']:.2f}" if s["tokens/pass"] else ""
        acc = f"{s['acceptance']:.0%}" if s["acceptance"] is not None else ""
        prefix = f"{s['greedy prefix']:.0%}" if s["greedy prefix"] is not None else ""
        same = {None: "", True: "yes", False: "NO"}[s["= one-token"]]
        lines.append(f"| {s['set']} | {s['method']} | {s['tok/s']:.2f} | {s['speed-up']:.2f}x | {tpp} "
                     f"| {acc} | {'yes' if s['identical'] else 'NO'} | {same} | {prefix} |")
    return "\n".join(lines)


def _write(args: argparse.Namespace, runs: list[Run], costs: dict[int, float]) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"bench_{Path(args.model).name}_{args.dtype}" + ("_unprepared" if args.no_accelerate else "")
    if args.draft and args.draft_dtype not in (None, args.dtype):
        stem += f"_draft-{args.draft_dtype}"
    if args.defaults:
        stem += "_defaults"
    meta = {"model": args.model, "draft": args.draft, "dtype": args.dtype,
            "draft_dtype": args.draft_dtype or args.dtype,
            "accelerated": not args.no_accelerate, "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats, "prompt_file": args.prompt_file, "plain_dtype": args.plain_dtype,
            "defaults": args.defaults,
            "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
            "pass_costs_ms": costs}
    (out / f"{stem}.json").write_text(json.dumps(
        {"meta": meta, "runs": [asdict(r) for r in runs], "summary": _summary(runs)}, indent=1))
    (out / f"{stem}.md").write_text(_table(runs) + "\n")
    print(_table(runs))
    _plot(_summary(runs), out / f"{stem}.png", stem)


def _plot(summary: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    sets = list(dict.fromkeys(s["set"] for s in summary))
    methods = list(dict.fromkeys(s["method"] for s in summary))
    width = 0.8 / len(sets)
    for j, set_name in enumerate(sets):
        rows = {s["method"]: s for s in summary if s["set"] == set_name}
        xs = [i + j * width for i in range(len(methods))]
        axes[0].bar(xs, [rows[m]["speed-up"] for m in methods], width, label=set_name)
        axes[1].bar(xs, [rows[m]["tokens/pass"] or 0 for m in methods], width, label=set_name)
    for ax, label in zip(axes, ["speed-up vs plain", "tokens per target pass (ours)"]):
        ax.set_xticks([i + width * (len(sets) - 1) / 2 for i in range(len(methods))], methods,
                      rotation=20, fontsize=8)
        ax.set_ylabel(label)
        ax.legend()
    axes[0].axhline(1.0, color="gray", lw=0.8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
