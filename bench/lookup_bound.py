"""How far any prompt-lookup proposer could get past HF's or vLLM's, replayed on recorded greedy outputs.

Greedy speculative decoding emits exactly the target's greedy output, so which candidates a
lookup proposer would get accepted at each step follows from that output alone: no model is
needed to replay a policy. Two modes.

Pass-cost mode (``--bench-json``, the default): over the greedy outputs of the benchmark prompts
(``--record``), it replays

- HF's prompt lookup (``prompt_lookup_num_tokens=10``, n-grams 2..1, earliest occurrence),
- an ORACLE that, at every step, knows which earlier occurrence of any suffix 1-3-gram (and of
  any substitution match: the suffix without its last token) continues the text furthest, and
  proposes exactly the tokens that will be accepted.

Each step costs ``cost(T) + overhead`` ms for a pass over T tokens (a measured profile, e.g.
``specdec bench``'s ``pass_costs_ms``). The oracle's speed over HF's is an upper bound for any
lookup proposer (ours included) on these prompts at these costs.

Engine-cost mode (``--outputs-json``: a ``bench/vllm_compare.py`` result, whose batch-1 outputs
are replayed on the prompts that script builds, tokenized with ``--model``): a vLLM step costs
``A`` ms, plus ``F`` if it carries any draft token, plus ``C`` per draft token (``--step-cost
A,F,C``, repeatable). It replays, with K = 8 draft tokens:

- ``vllm_ngram``: vLLM 0.32's ngram proposer (``prompt_lookup_min`` 2, ``max`` 4): the longest
  suffix n-gram with an earlier occurrence, its earliest occurrence, the K tokens after it (fewer
  where the context ends first), checked against the recorded draft counts;
- ``vllm_ngram_min3``: the same with ``prompt_lookup_min`` 3 (no draft from a 2-gram match: a
  rule that abstains without knowing the future);
- ``specdec_earliest``: specdec.vllm.PromptLookup's match (``ops.ngram_match``, n = 4 down to 2,
  ``earliest=True``), every draft whole (its clock-driven draft sizing is not replayed);
- ``ngram_trimmed``: vLLM's match, proposing exactly the tokens that will be accepted (none when
  none will be): what perfect draft sizing adds to vLLM's choice of occurrence;
- ``oracle_k8_n2-4``: of every earlier occurrence of a suffix 2-4-gram, the one that continues
  furthest, proposing exactly what will be accepted (what the choice of occurrence adds);
- ``oracle_k8`` / ``oracle_k16``: the same over suffix 1-4-grams (every earlier occurrence of the
  last token), at most 8 / 16 tokens: ORACLE-K and ORACLE-K16;
- ``... dp``: the cheapest schedule of any prefix of the oracle's drafts (a shorter draft, or
  none, where that pays at the given costs): the optimum over all such proposers.
- causal proposers (:class:`Causal`, which sees only the context, so what verification revealed):
  ``ptr`` (a copy pointer that follows the last copy's source while the emitted tokens agree
  with it), ``+sync64`` (re-sync within 64 source tokens where they part), ``nearest`` (the
  occurrence nearest after the last copy), ``+n1`` (1-gram matches too), ``sized@A`` (each draft
  cut to what raises the expected tokens per ms at that fit's prices, with acceptance learnt
  online; ``shared``: across the set's requests).

The prefill is left out of the estimated times (it is the same for every policy), so the ratios
to ``vllm_ngram`` are upper bounds for the end-to-end ones.

    python bench/lookup_bound.py --record                 # greedy outputs of the bench prompts
    python bench/lookup_bound.py --bench-json bench/results/bench_qwen2.5-coder-1.5b_float32.json
    python bench/lookup_bound.py --outputs-json bench/results/vllm_compare/vllm_ngram.json \\
        --model qwen2.5-coder-0.5b --step-cost 121,53,13 --step-cost 178,70,9
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from specdec import ops
from specdec.integrations.vllm.acceptance import FIRST, LEAN

OUTPUTS = Path(__file__).parent / "results" / "greedy_outputs_qwen2.5-coder-1.5b.json"
ENGINE_COSTS = ((121.0, 53.0, 13.0), (178.0, 70.0, 9.0))  # vLLM CPU, batch 1: two measured fits
Step = Callable[[list[int], list[int]], tuple[int, int]]   # (context, truth) -> (accepted, drafted)


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


def engine_ms(step_cost: tuple[float, float, float], drafted: int) -> float:
    """A vLLM step: A, plus F and C per draft token when it carries drafts."""
    a, f, c = step_cost
    return a + (f + c * drafted if drafted else 0.0)


def accepted(candidates: list[int], truth: list[int]) -> int:
    n = 0
    while n < len(candidates) and n < len(truth) and candidates[n] == truth[n]:
        n += 1
    return n


# ---- policies: step(context, truth) -> (accepted, draft tokens proposed) ------------------------
def hf_step(context: list[int], truth: list[int]) -> tuple[int, int]:
    draft, n = ops.ngram_match(torch.tensor([context]), min_n=1, max_n=2, k=10, earliest=True)
    chain = draft[0, : int(n[0])].tolist()
    return accepted(chain, truth), len(chain)


def suffix_match(context: list[int], min_n: int = 2, max_n: int = 4, after: int | None = None) -> tuple[int, int]:
    """vLLM 0.32's match (``_find_longest_matched_ngram_and_propose_tokens``, a KMP over the
    reversed context) by brute force: the longest n in [min_n, max_n] whose suffix n-gram occurs
    earlier (starting before ``L - n``, overlap allowed), and where what follows its earliest
    occurrence starts; with ``after``, its first occurrence whose continuation starts there or
    later, where there is one. ``(n, start)``, or ``(0, -1)`` when no suffix n-gram recurs."""
    size = len(context)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = context[size - n:]
        starts = [p + n for p in range(size - n) if context[p:p + n] == suffix]
        if starts:
            return n, next((q for q in starts if after is not None and q >= after), starts[0])
    return 0, -1


def vllm_ngram_draft(context: list[int], k: int = 8, min_n: int = 2, max_n: int = 4) -> list[int]:
    """vLLM's ngram draft: the k tokens after :func:`suffix_match`'s occurrence, or as many as the
    context holds."""
    n, start = suffix_match(context, min_n, max_n)
    return context[start:start + k] if n else []


def vllm_ngram_step(context: list[int], truth: list[int], k: int = 8, min_n: int = 2) -> tuple[int, int]:
    draft = vllm_ngram_draft(context, k, min_n)
    return accepted(draft, truth), len(draft)


def ngram_trimmed_step(context: list[int], truth: list[int], k: int = 8) -> tuple[int, int]:
    a = accepted(vllm_ngram_draft(context, k), truth)
    return a, a


def specdec_earliest_step(context: list[int], truth: list[int], k: int = 8, min_n: int = 2,
                          max_n: int = 4) -> tuple[int, int]:
    """specdec.vllm.PromptLookup's match (its ``lookup``: ``ops.ngram_match`` once per n, longest
    first, earliest occurrence), the whole draft."""
    ctx = torch.tensor([context])
    for n in range(max_n, min_n - 1, -1):
        draft, count = ops.ngram_match(ctx, min_n=n, max_n=n, k=k, earliest=True)
        if int(count[0]):
            chain = draft[0, : int(count[0])].tolist()
            return accepted(chain, truth), len(chain)
    return 0, 0


class Causal:
    """A realistic prompt-lookup proposer, one per request: each step it sees the context only, so
    of its last draft what verification accepted (and the token the target emitted after it). A
    draft is a copy of up to ``k`` tokens from ``source``; its key says how the source was found:
    ``"ptr"``, ``"sync2"``/``"sync1"`` or n (a suffix n-gram match, vLLM's with its options).

    - ``pointer``: where the last copy came from is kept (also when nothing was proposed). While
      the tokens emitted since equal the source's continuation, it copies on from right after them
      (``"ptr"``), wherever the suffix n-gram's earliest occurrence is.
    - ``resync`` W: where they differ, the first occurrence of the context's suffix 2-gram, else
      1-gram, within W tokens of the source from where they differed (``"sync2"``, ``"sync1"``).
    - ``nearest``: of the longest suffix n-gram's occurrences, the first one continuing at or after
      where the last copy's source and the emitted tokens parted (else the earliest: vLLM's).
    - ``cost`` (A, F, C): of each draft, the prefix that maximises the step's expected tokens per
      ms, ``(1 + sum of its tokens' chances) / (A + F + C j)`` against ``1 / A`` for none. A
      token's chance comes from acceptance counts per (key, position), learnt from what the
      emitted tokens showed of every candidate: also of the tokens that were not proposed.
      ``geometric``: one rate per key, not per position.
    """

    def __init__(self, k: int = 8, min_n: int = 2, pointer: bool = False, resync: int = 0,
                 nearest: bool = False, cost: tuple[float, float, float] | None = None,
                 geometric: bool = False, sync_n: tuple[int, ...] = (2, 1),
                 counts: dict[object, list[list[float]]] | None = None) -> None:
        self.k, self.min_n, self.pointer, self.resync, self.nearest = k, min_n, pointer, resync, nearest
        self.cost, self.geometric, self.sync_n = cost, geometric, sync_n
        self.last: tuple[int, int, object, list[int]] | None = None  # context length, source, key, candidate
        self.counts = {} if counts is None else counts  # key -> [passed, tried] per position

    def __call__(self, context: list[int], truth: list[int]) -> tuple[int, int]:
        key, source = self.source(context, self.learn(context))
        candidate = context[source:source + self.k] if key else []
        draft = candidate[:self.size(key, len(candidate))] if self.cost else candidate
        self.last = (len(context), source, key, candidate) if source >= 0 else None
        return accepted(draft, truth), len(draft)

    def learn(self, context: list[int]) -> tuple[int, bool] | None:
        """Count what the tokens emitted since the last step showed of its candidate. Where the
        last source and the emitted tokens part (or the source's next token), and whether they
        agree throughout; None: no source."""
        if self.last is None:
            return None
        length, source, key, candidate = self.last
        emitted = context[length:]
        if candidate:
            passed, tried = self.counts.setdefault(key, [[0.0] * self.k, [0.0] * self.k])
            m = accepted(candidate, emitted)
            for i in range(min(m + 1, len(emitted), len(candidate))):
                tried[i] += 1
                passed[i] += i < m
        m = accepted(context[source:], emitted)
        return source + m, m == len(emitted)

    def source(self, context: list[int], parted: tuple[int, bool] | None) -> tuple[object, int]:
        """``(key, where the copy starts)``; key 0: no draft (the start is then the pointer kept)."""
        size, (anchor, synced) = len(context), parted or (None, False)
        if anchor is not None and self.pointer and anchor < size:
            if synced:
                return "ptr", anchor
            for n in self.sync_n if self.resync else ():
                suffix = context[size - n:]
                for p in range(anchor, min(anchor + self.resync, size - n)):
                    if context[p:p + n] == suffix:
                        return f"sync{n}", p + n
        n, start = suffix_match(context, self.min_n, 4, anchor if self.nearest else None)
        return (n, start) if n else (0, anchor if self.pointer and anchor is not None else -1)

    def chances(self, key: object, count: int) -> list[float]:
        """Per token of a draft, the chance that it is accepted with those before it: the counts,
        leaning on FIRST at position 0 and on the rate before beyond (like Acceptance.rates)."""
        passed, tried = self.counts.get(key, [[0.0] * self.k, [0.0] * self.k])
        out, rate, chance = [], FIRST, 1.0
        for i in range(count):
            if self.geometric:  # one rate for every position
                rate = (sum(passed) + LEAN * FIRST) / (sum(tried) + LEAN)
            else:
                rate = (passed[i] + LEAN * rate) / (tried[i] + LEAN)
            chance *= rate
            out.append(chance)
        return out

    def size(self, key: object, count: int) -> int:
        a, f, c = self.cost
        best, best_rate, tokens = 0, 1 / a, 1.0
        for j, chance in enumerate(self.chances(key, count), 1):
            tokens += chance
            if tokens / (a + f + c * j) > best_rate:
                best, best_rate = j, tokens / (a + f + c * j)
        return best


def oracle_best(context: list[int], truth: list[int], longest: int = 64, ngrams: tuple[int, ...] = (1, 2, 3),
                substitution: bool = True) -> int:
    """The most tokens any earlier occurrence of a suffix n-gram (``ngrams``; with
    ``substitution``, also of the suffix without its last token) gets accepted, at most ``longest``."""
    best, length = 0, len(context)
    for end in (length, length - 1) if substitution else (length,):  # plain matches, then substitution matches
        for n in ngrams:
            if end - n < 0:
                continue
            suffix = context[end - n:end]
            skip = length - end
            for p in range(end - n):
                if context[p:p + n] == suffix:
                    start = p + n + skip
                    best = max(best, accepted(context[start:start + longest], truth))
    return best


def oracle_step(context: list[int], truth: list[int], longest: int = 64, ngrams: tuple[int, ...] = (1, 2, 3),
                substitution: bool = True) -> tuple[int, int]:
    best = oracle_best(context, truth, longest, ngrams, substitution)
    return best, best


def replay(prompt: list[int], output: list[int], step: Step, new_tokens: int) -> list[tuple[int, int]]:
    """(accepted, draft tokens) per step after the prefill, until new_tokens are out."""
    done, steps = 1, []  # the prefill emits the first token
    while done < new_tokens:
        a, d = step(prompt + output[:done], output[done:])
        steps.append((a, d))
        done += a + 1
    return steps


def best_schedule_ms(prompt: list[int], output: list[int], best: Callable[[list[int], list[int]], int],
                     new_tokens: int, step_ms: Callable[[int], float]) -> float:
    """The cheapest way to emit new_tokens when at position i any of the first ``best(...)`` tokens
    of the oracle's draft (or none) may be proposed: what no proposer drafting from the same
    occurrences can beat (the greedy oracle always proposes all of them)."""
    ms = [0.0] * (new_tokens + 1)
    for done in range(new_tokens - 1, 0, -1):
        top = best(prompt + output[:done], output[done:])
        ms[done] = min(step_ms(j) + ms[min(done + j + 1, new_tokens)] for j in range(top + 1))
    return ms[1]


# ---- pass-cost mode ------------------------------------------------------------------------------
def pass_cost_mode(args: argparse.Namespace) -> list[str]:
    profile = {1: 162.0, 2: 167.0, 4: 162.0, 8: 184.0, 16: 216.0, 32: 325.0}
    if args.bench_json:
        profile = {int(k): v for k, v in json.loads(args.bench_json.read_text())["meta"]["pass_costs_ms"].items()}
    outputs = json.loads(args.outputs.read_text())
    lines = [f"pass costs (ms): {profile}, overhead {args.overhead_ms} ms per step\n",
             "| set | policy | passes | est. tok/s | vs HF |", "|---|---|---|---|---|"]
    for set_name in ("editing", "generation"):
        keys = [k for k in outputs if k.startswith(set_name)]
        totals = {}
        for policy, step in (("hf_prompt_lookup", hf_step), ("oracle_lookup", oracle_step)):
            passes, ms = 0, 0.0
            for key in keys:
                steps = replay(outputs[key]["prompt"], outputs[key]["output"], step, args.new_tokens)
                passes += len(steps) + 1
                ms += sum(cost(profile, 1 + d) + args.overhead_ms for _, d in steps)
            totals[policy] = len(keys) * args.new_tokens / ms * 1e3
            lines.append(f"| {set_name} | {policy} | {passes} | {totals[policy]:.2f} | "
                         f"{totals[policy] / totals['hf_prompt_lookup']:.2f}x |")
    return lines


# ---- engine-cost mode ----------------------------------------------------------------------------
def engine_inputs(outputs_json: Path, model: str) -> dict[str, list[dict]]:
    """Per prompt set, the batch-1 measure's prompts (as bench/vllm_compare.py tokenizes them) and
    outputs, with its recorded draft counts."""
    sys.path.insert(0, str(Path(__file__).parent))
    from vllm_compare import prompt_sets, token_ids

    from specdec import models

    model_dir = str(models.model_dir(model)) if model in models.REGISTRY else model
    sets = prompt_sets(False)
    inputs: dict[str, list[dict]] = {}
    for m in json.loads(outputs_json.read_text()):
        if m["batch"] != 1:
            continue
        ids = token_ids(model_dir, sets[m["prompts"]])
        assert len(ids) == len(m["outputs"]), (m["prompts"], len(ids), len(m["outputs"]))
        inputs[m["prompts"]] = [{"prompt": p, "output": o, "measure": m} for p, o in zip(ids, m["outputs"])]
    return inputs


ENGINE_POLICIES: tuple[tuple[str, Step, Callable[[list[int], list[int]], int] | None], ...] = (
    ("vllm_ngram", vllm_ngram_step, None),
    ("specdec_earliest", specdec_earliest_step, None),
    ("vllm_ngram_min3", lambda c, t: vllm_ngram_step(c, t, 8, 3), None),
    ("ngram_trimmed", ngram_trimmed_step, None),
    ("oracle_k8_n2-4", lambda c, t: oracle_step(c, t, 8, (2, 3, 4), False),
     lambda c, t: oracle_best(c, t, 8, (2, 3, 4), False)),
    ("oracle_k8", lambda c, t: oracle_step(c, t, 8, (1, 2, 3, 4), False),
     lambda c, t: oracle_best(c, t, 8, (1, 2, 3, 4), False)),
    ("oracle_k16", lambda c, t: oracle_step(c, t, 16, (1, 2, 3, 4), False),
     lambda c, t: oracle_best(c, t, 16, (1, 2, 3, 4), False)),
)


CAUSAL_POLICIES: tuple[tuple[str, dict[str, Any]], ...] = (  # Causal's options; sized: once per cost fit
    ("ptr", dict(pointer=True)),
    ("ptr+sync64", dict(pointer=True, resync=64)),
    ("nearest", dict(nearest=True)),
    ("ptr+sync64+nearest", dict(pointer=True, resync=64, nearest=True)),
    ("ptr+sync64+nearest+n1", dict(pointer=True, resync=64, nearest=True, min_n=1)),
    ("sized", dict(sized=True)),
    ("sized_geometric", dict(sized=True, geometric=True)),
    ("ptr+sync64+sized", dict(pointer=True, resync=64, sized=True)),
    ("ptr+sync64+nearest+sized", dict(pointer=True, resync=64, nearest=True, sized=True)),
    ("ptr+sync64+sized shared", dict(pointer=True, resync=64, sized=True, shared=True)),
)


def causal_policies(costs: list[tuple[float, float, float]]) -> list[tuple[str, Callable[[dict], Step]]]:
    """Per causal policy row, its name and ``make(counts)``, a fresh proposer for a request
    (``shared``: all the set's requests count acceptance in ``counts``, as one engine would); a
    ``sized`` policy once per cost fit, sizing its drafts at that fit's prices (``@A``)."""
    out: list[tuple[str, Callable[[dict], Step]]] = []
    for name, options in CAUSAL_POLICIES:
        kw = {k: v for k, v in options.items() if k not in ("sized", "shared")}
        for fit in costs if options.get("sized") else [None]:
            out.append((f"{name}@{fit[0]:g}" if fit else name,
                        lambda counts, kw=kw, fit=fit, shared=options.get("shared"):
                        Causal(**kw, cost=fit, counts=counts if shared else None)))
    return out


def engine_cost_mode(args: argparse.Namespace) -> list[str]:
    costs = args.step_cost or list(ENGINE_COSTS)
    inputs = engine_inputs(args.outputs_json, args.model)
    fits = " | ".join(f"A={a:g} F={f:g} C={c:g}" for a, f, c in costs)
    lines = [f"outputs: {args.outputs_json}, model {args.model}, batch 1; step costs (ms): {fits}; "
             "decode steps only (the prefill is the same for every policy)\n"]
    head = "| set | policy | steps | steps with drafts | draft tokens | accepted |"
    head += "".join(f" est. s ({a:g},{f:g},{c:g}) | vs ngram |" for a, f, c in costs)
    lines += [head, "|" + "---|" * (6 + 2 * len(costs))]
    checks = []
    for set_name in ("editing", "generation"):
        prompts = inputs[set_name]
        new_tokens = len(prompts[0]["output"])
        base: list[float] = []
        rows = [(p, lambda counts, s=s: s, b) for p, s, b in ENGINE_POLICIES]
        for policy, make, best in rows + [(p, make, None) for p, make in causal_policies(costs)]:
            counts: dict = {}  # acceptance counts of the set's requests, for policies that share them
            steps = [s for item in prompts for s in replay(item["prompt"], item["output"], make(counts), new_tokens)]
            ms = [sum(engine_ms(sc, d) for _, d in steps) for sc in costs]
            base = base or ms
            drafting = sum(1 for _, d in steps if d)
            tokens, acc = sum(d for _, d in steps), sum(a for a, _ in steps)
            lines.append(f"| {set_name} | {policy} | {len(steps)} | {drafting} | {tokens} | {acc} |"
                         + "".join(f" {t / 1e3:.2f} | {b / t:.3f}x |" for t, b in zip(ms, base)))
            if policy == "vllm_ngram":
                m = prompts[0]["measure"]
                past_end = sum(past_the_end(item["prompt"], item["output"], new_tokens) for item in prompts)
                checks.append(f"- {set_name}: replayed vllm_ngram {drafting} drafts, {tokens} draft tokens, "
                              f"{acc} accepted (+{past_end} drafted past the last output token, which vLLM may "
                              f"count); recorded ({m['config']}) {m['drafts']:g} drafts, {m['draft_tokens']:g} draft tokens, "
                              f"{m['accepted']:g} accepted")
            if best is not None:
                dp = [sum(best_schedule_ms(item["prompt"], item["output"], best, new_tokens,
                                           lambda d, sc=sc: engine_ms(sc, d)) for item in prompts) for sc in costs]
                lines.append(f"| {set_name} | {policy} dp | - | - | - | - |"
                             + "".join(f" {t / 1e3:.2f} | {b / t:.3f}x |" for t, b in zip(dp, base)))
    return lines + ["", "vLLM ngram replay against the recorded counters:"] + checks


def past_the_end(prompt: list[int], output: list[int], new_tokens: int) -> int:
    """Draft tokens of vLLM's last step past the last output token, when all before them were
    accepted (vLLM verifies them, the replay has nothing to check them against)."""
    done = 1
    while done < new_tokens:
        draft = vllm_ngram_draft(prompt + output[:done])
        a = accepted(draft, output[done:])
        if done + a >= new_tokens:
            return len(draft) - a if a == new_tokens - done else 0
        done += a + 1
    return 0


def parse_cost(text: str) -> tuple[float, float, float]:
    a, f, c = (float(x) for x in text.split(","))
    return a, f, c


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record", action="store_true", help="record the greedy outputs first")
    parser.add_argument("--outputs", type=Path, default=OUTPUTS)
    parser.add_argument("--bench-json", type=Path, help="take pass_costs_ms from a specdec bench run")
    parser.add_argument("--overhead-ms", type=float, default=20.0, help="per-step cost besides the pass")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--outputs-json", type=Path,
                        help="engine-cost mode: a bench/vllm_compare.py result (its batch-1 outputs)")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="its model (name or directory): the tokenizer")
    parser.add_argument("--step-cost", type=parse_cost, action="append", metavar="A,F,C",
                        help="a vLLM step's ms: A, +F with drafts, +C per draft token (repeatable; "
                             f"default {' and '.join(','.join(f'{x:g}' for x in c) for c in ENGINE_COSTS)})")
    parser.add_argument("--out", type=Path, help="also write the table there, the command on top")
    args = parser.parse_args()
    if args.record:
        record(args.outputs, args.new_tokens + 32)
    lines = engine_cost_mode(args) if args.outputs_json else pass_cost_mode(args)
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        env = [f"{k}={os.environ[k]}" for k in ("HF_HUB_OFFLINE", "PYTHONPATH") if k in os.environ]
        python = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else "python"
        command = " ".join(env + [shlex.join([python, "bench/lookup_bound.py", *sys.argv[1:]])])
        args.out.write_text(f"    {command}\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
