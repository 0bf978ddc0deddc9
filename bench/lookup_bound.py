"""How far any prompt-lookup proposer could get past HF's, replayed on recorded greedy outputs.

Greedy speculative decoding emits exactly the target's greedy output, so which candidates a
lookup proposer would get accepted at each step follows from that output alone: no model is
needed to replay a policy. This script replays, over the outputs of the benchmark prompts:

- HF's prompt lookup (``prompt_lookup_num_tokens=10``, n-grams 2..1, earliest occurrence),
- an ORACLE that, at every step, knows which earlier occurrence of any suffix 1-3-gram (and of
  any substitution match: the suffix without its last token) continues the text furthest, and
  proposes exactly the tokens that will be accepted.

Each step costs ``cost(T) + overhead`` ms for a pass over T tokens (a measured profile, e.g.
``specdec bench``'s ``pass_costs_ms``). The oracle's speed over HF's is an upper bound for any
lookup proposer (ours included) on these prompts at these costs.

    python bench/lookup_bound.py --record                 # greedy outputs of the bench prompts
    python bench/lookup_bound.py --bench-json bench/results/bench_qwen2.5-coder-1.5b_float32.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specdec import ops

OUTPUTS = Path(__file__).parent / "results" / "greedy_outputs_qwen2.5-coder-1.5b.json"


def record(path: Path, new_tokens: int) -> None:
    from specdec import pack_linear_layers, models
    from specdec.cli.bench import EDITING_PROMPTS, GENERATION_PROMPTS
    from specdec.cli.common import encode

    model, tok = models.load("qwen2.5-coder-1.5b", dtype=torch.float32)
    pack_linear_layers(model)
    outputs = {}
    for name, prompts in (("editing", EDITING_PROMPTS), ("generation", GENERATION_PROMPTS)):
        for i, text in enumerate(prompts):
            ids = encode(tok, text, chat=True)
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=new_tokens, temperature=None, top_k=None, top_p=None)
            outputs[f"{name}{i}"] = {"prompt": ids[0].tolist(), "output": out[0, ids.shape[1]:].tolist()}
            print(f"recorded {name}{i}", flush=True)
    path.write_text(json.dumps(outputs))


def cost(profile: dict[int, float], t: int) -> float:
    """Piecewise-linear in the profiled points, linear beyond the last two. (CostModel.target
    stays flat beyond the profile, which would price the oracle's 33-65-token passes as 32-token
    ones and loosen the bound: 1.34x instead of 1.30x on the editing set.)"""
    ks = sorted(profile)
    if t <= ks[0]:
        return profile[ks[0]]
    lo, hi = max((k for k in ks if k <= t), default=ks[-2]), min((k for k in ks if k >= t), default=ks[-1])
    if t > ks[-1]:
        lo, hi = ks[-2], ks[-1]
    if lo == hi:
        return profile[lo]
    return profile[lo] + (t - lo) * (profile[hi] - profile[lo]) / (hi - lo)


def accepted(candidates: list[int], truth: list[int]) -> int:
    n = 0
    while n < len(candidates) and n < len(truth) and candidates[n] == truth[n]:
        n += 1
    return n


def hf_step(context: list[int], truth: list[int]) -> tuple[int, int]:
    draft, n = ops.ngram_match(torch.tensor([context]), min_n=1, max_n=2, k=10, earliest=True)
    chain = draft[0, : int(n[0])].tolist()
    return accepted(chain, truth), 1 + len(chain)


def oracle_step(context: list[int], truth: list[int], longest: int = 64) -> tuple[int, int]:
    best, length = 0, len(context)
    for end in (length, length - 1):  # plain matches, then substitution matches
        for n in (1, 2, 3):
            if end - n < 0:
                continue
            suffix = context[end - n:end]
            skip = length - end
            for p in range(end - n):
                if context[p:p + n] == suffix:
                    start = p + n + skip
                    best = max(best, accepted(context[start:start + longest], truth))
    return best, 1 + best


def replay(prompt: list[int], output: list[int], step, new_tokens: int) -> list[tuple[int, int]]:
    """(accepted, pass tokens) per step after the prefill, until new_tokens are out."""
    done, steps = 1, []  # the prefill emits the first token
    while done < new_tokens:
        a, t = step(prompt + output[:done], output[done:])
        steps.append((a, t))
        done += a + 1
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record", action="store_true", help="record the greedy outputs first")
    parser.add_argument("--outputs", type=Path, default=OUTPUTS)
    parser.add_argument("--bench-json", type=Path, help="take pass_costs_ms from a specdec bench run")
    parser.add_argument("--overhead-ms", type=float, default=20.0, help="per-step cost besides the pass")
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    if args.record:
        record(args.outputs, args.new_tokens + 32)
    profile = {1: 162.0, 2: 167.0, 4: 162.0, 8: 184.0, 16: 216.0, 32: 325.0}
    if args.bench_json:
        profile = {int(k): v for k, v in json.loads(args.bench_json.read_text())["meta"]["pass_costs_ms"].items()}
    outputs = json.loads(args.outputs.read_text())
    print(f"pass costs (ms): {profile}, overhead {args.overhead_ms} ms per step\n")
    print("| set | policy | passes | est. tok/s | vs HF |")
    print("|---|---|---|---|---|")
    for set_name in ("editing", "generation"):
        keys = [k for k in outputs if k.startswith(set_name)]
        totals = {}
        for policy, step in (("hf_prompt_lookup", hf_step), ("oracle_lookup", oracle_step)):
            passes, ms = 0, 0.0
            for key in keys:
                steps = replay(outputs[key]["prompt"], outputs[key]["output"], step, args.new_tokens)
                passes += len(steps) + 1
                ms += sum(cost(profile, t) + args.overhead_ms for _, t in steps)
            totals[policy] = len(keys) * args.new_tokens / ms * 1e3
            print(f"| {set_name} | {policy} | {passes} | {totals[policy]:.2f} | "
                  f"{totals[policy] / totals['hf_prompt_lookup']:.2f}x |")


if __name__ == "__main__":
    main()
