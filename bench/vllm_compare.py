"""vLLM without and with speculation, specdec's proposers and heads inside it, and specdec's own
loop beside them: the project's code generation and code editing prompts, greedy, one request at
a time (batch 1) and 8 at once (batch 8). One process per engine configuration (a fresh vLLM
engine each, so no run inherits another's caches); every output is compared with vLLM plain's.
vLLM's prefix cache is off unless ``--prefix-caching``: the benchmark sends the same prompts again
(batch 8 after batch 1, every round after the first, batch 8's prompts twice), and a prefix cache
turns those prefills into lookups that distinct requests would not get and that specdec's own
loop, which prefills every request, does not take. This file is the parent (the processes, the
rounds, the table); each configuration's process runs ``bench/vllm_workers.py``'s side.

Configurations: ``vllm_plain``; ``vllm_ngram`` (vLLM's own prompt lookup, 8 tokens, n-grams of
2-4); ``specdec_prompt_lookup`` and ``specdec_lookahead`` (``specdec.vllm``'s proposers, 8
tokens); ``specdec_medusa_in_vllm`` (with ``--medusa-heads``: heads from ``specdec
train-medusa``, exported for vLLM); ``specdec_eagle_in_vllm`` (with ``--eagle``: a drafter from
``specdec train-eagle``, exported for vLLM's ``eagle`` method, chains of 3); and with
``--standalone-python`` (the main environment's interpreter, one that imports specdec, with
transformers >= 5.24) ``standalone_one_token``, ``standalone_prompt_lookup``,
``standalone_medusa`` and ``standalone_eagle``: ``specdec.generate`` on the same token ids.

Run it on an idle machine (figures under load are not figures), from the repository root:

    LD_PRELOAD=$PWD/.venv-vllm/lib/libiomp5.so .venv-vllm/bin/python bench/vllm_compare.py \\
        --model qwen2.5-coder-0.5b --medusa-heads heads/ --standalone-python .venv/bin/python

It writes ``results.json``, ``table.md`` and ``plot.png`` (with matplotlib) under ``--out``.
``--smoke`` checks the script end to end in a few minutes (SmolLM2-135M, one prompt per set,
8 tokens, eager engines): its figures mean nothing. ``--all-cores`` runs every engine on all the
machine's cores (vLLM's default leaves one to its scheduler; `engine_env` says what it sets).

``--rounds N`` interleaves the configurations: every engine starts once and stays up, then each
round runs every configuration in turn (the order rotated each round), so a drift of the machine
between minutes touches all of them alike. The table gives each row's median tok/s with its
range, and the ratio to vLLM plain as the median of the ratios within each round. With more than
one round the engines are up together: lower ``--kv-cache-gib`` (1 GiB holds batch 8 of 4096
tokens of the 0.5B) and narrow the run with ``--sets`` and ``--batches``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vllm_workers import READY, ROUND_DONE, Measure, worker

BATCHES = (1, 8)
VLLM_CONFIGS = ("vllm_plain", "vllm_ngram", "specdec_prompt_lookup", "specdec_lookahead")
MEDUSA_CONFIGS = ("specdec_medusa_in_vllm",)
EAGLE_CONFIGS = ("specdec_eagle_in_vllm",)
STANDALONE_CONFIGS = ("standalone_one_token", "standalone_prompt_lookup")


class Worker:
    """The parent's handle on one configuration's process: started once, asked for rounds over a pipe."""

    def __init__(self, config: str, command: list[str], env: dict[str, str], result: Path) -> None:
        self.config, self.result = config, result
        print(f"[vllm_compare] {config}: starting", flush=True)
        started = time.perf_counter()
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.wait_for(READY)
        print(f"[vllm_compare] {config}: up in {time.perf_counter() - started:.0f} s", flush=True)

    def wait_for(self, marker: str) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.rstrip("\n") == marker:
                return
            print(line, end="", flush=True)
        raise SystemExit(f"vllm_compare: {self.config} exited (status {self.process.wait()}) before '{marker}'")

    def round(self, index: int) -> list[Measure]:
        assert self.process.stdin is not None
        started = time.perf_counter()
        self.process.stdin.write(f"{index}\n")
        self.process.stdin.flush()
        self.wait_for(ROUND_DONE)
        print(f"[vllm_compare] {self.config}: round {index} in {time.perf_counter() - started:.0f} s", flush=True)
        return [Measure(**m) for m in json.loads(self.result.read_text())]

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        if status := self.process.wait():
            raise SystemExit(f"vllm_compare: {self.config} exited with status {status}")


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    configs = [(c, sys.executable) for c in VLLM_CONFIGS]
    if args.medusa_heads:
        import specdec
        from specdec.vllm import export_medusa, lm_head_weight

        heads = specdec.MedusaHeads.load(args.medusa_heads)
        export_medusa(heads, out / "medusa-vllm", lm_head=lm_head_weight(args.model_dir))
        configs += [(c, sys.executable) for c in MEDUSA_CONFIGS]
    if args.eagle:
        from specdec.vllm import export_eagle

        export_eagle(args.eagle, out / "eagle-vllm")
        configs += [(c, sys.executable) for c in EAGLE_CONFIGS]
    if args.standalone_python:
        standalone = list(STANDALONE_CONFIGS) + (["standalone_medusa"] if args.medusa_heads else [])
        standalone += ["standalone_eagle"] if args.eagle else []
        configs += [(c, args.standalone_python) for c in standalone]
    if args.configs:
        unknown = set(args.configs) - {c for c, _ in configs}
        if unknown:
            raise SystemExit(f"vllm_compare: --configs: unknown or not enabled {sorted(unknown)}; "
                             f"these run: {[c for c, _ in configs]}")
    measures: list[Measure] = []
    selected = []
    for config, python in configs:
        result = out / f"{config}.json"
        # vllm_plain is the reference of every row: it runs unless --out already has its result.
        needed = config == "vllm_plain" and not result.is_file()
        if args.configs and config not in args.configs and not needed:
            if result.is_file():  # an earlier run's, kept for the table
                print(f"[vllm_compare] {config}: the result already in {result}", flush=True)
                measures += [Measure(**m) for m in json.loads(result.read_text())]
            continue
        selected.append((config, python))
    env = {**os.environ, **engine_env(args)}

    def start(config: str, python: str) -> Worker:
        command = [python, __file__, "--worker", config, "--result", str(out / f"{config}.json"),
                   "--model", args.model_dir, "--max-tokens", str(args.max_tokens),
                   "--sets", *args.sets, "--batches", *map(str, args.batches),
                   "--exported-heads", str(out / "medusa-vllm"), "--exported-eagle", str(out / "eagle-vllm")]
        command += ["--medusa-heads", args.medusa_heads] if args.medusa_heads else []
        command += ["--medusa-tokens", str(args.medusa_tokens)] if args.medusa_tokens else []
        command += ["--eagle", args.eagle] if args.eagle else []
        command += ["--smoke"] if args.smoke else []
        command += ["--prefix-caching"] if args.prefix_caching else []
        return Worker(config, command, env, out / f"{config}.json")

    rounds: dict[str, list[Measure]] = {config: [] for config, _ in selected}
    if args.rounds == 1:  # one engine up at a time
        for config, python in selected:
            engine = start(config, python)
            rounds[config] += engine.round(0)
            engine.close()
    else:  # every engine up, the configurations interleaved, their order rotated each round
        engines = [start(config, python) for config, python in selected]
        for index in range(args.rounds):
            shift = index % len(engines)
            for engine in engines[shift:] + engines[:shift]:
                rounds[engine.config] += engine.round(index)
        for engine in engines:
            engine.close()
    for config, runs in rounds.items():
        (out / f"{config}.json").write_text(json.dumps([asdict(m) for m in runs]))
        measures += runs
    write(out, measures, args)


def engine_env(args: argparse.Namespace) -> dict[str, str]:
    """The engines' environment. ``--all-cores``: vLLM's CPU worker gets every core (by default it
    leaves one to the scheduler's process: on 2 cores, half the machine), and numba, which vLLM's
    ``ngram`` proposer runs on, uses its own thread pool, not OpenMP: on every core, with the
    Intel OpenMP that vLLM preloads, numba's OpenMP pool made ``ngram`` slower than no speculation
    (measured in docs/benchmarks.md, "Inside vLLM", run D)."""
    env = {"VLLM_CPU_KVCACHE_SPACE": args.kv_cache_gib}
    if args.all_cores:
        env.update(VLLM_CPU_NUM_OF_RESERVED_CPU="0", NUMBA_THREADING_LAYER="workqueue")
    return env


def write(out: Path, measures: list[Measure], args: argparse.Namespace) -> None:
    """The table: per configuration, prompt set and batch, the median tok/s over the rounds, its
    range, and the median of the ratios to vLLM plain within each round (paired, so a drift of the
    machine between rounds cancels)."""
    plain = {(m.prompts, m.batch, m.round): m for m in measures if m.config == "vllm_plain"}
    groups: dict[tuple[str, str, int], list[Measure]] = {}
    for m in measures:
        groups.setdefault((m.config, m.prompts, m.batch), []).append(m)
    rows = []
    for (config, prompts, batch), runs in groups.items():
        rates = [m.tokens_per_s for m in runs]
        paired = [m.tokens_per_s / plain[(prompts, batch, m.round)].tokens_per_s
                  for m in runs if (prompts, batch, m.round) in plain]
        reference = min((k for k in plain if k[:2] == (prompts, batch)), key=lambda k: k[2])
        drafts, draft_tokens, accepted = (sum(getattr(m, f) for m in runs) for f in ("drafts", "draft_tokens", "accepted"))
        rows.append({"config": config, "prompts": prompts, "batch": batch, "rounds": len(runs),
                     "tokens": runs[0].tokens, "seconds": [round(m.seconds, 3) for m in runs],
                     "tokens_per_s": round(statistics.median(rates), 2),
                     "range": [round(min(rates), 2), round(max(rates), 2)],
                     "vs_vllm_plain": round(statistics.median(paired), 3),
                     "identical_to_vllm_plain": all(m.outputs == plain[reference].outputs for m in runs),
                     "acceptance": round(accepted / draft_tokens, 3) if draft_tokens else None,
                     "accepted_per_draft": round(accepted / drafts, 2) if drafts else None})
    meta = {"model": args.model_dir, "max_tokens": args.max_tokens, "smoke": args.smoke,
            "all_cores": args.all_cores, "rounds": args.rounds, "prefix_caching": args.prefix_caching,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": os.uname().nodename,
            "cpus": os.cpu_count()}
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    head = ("| config | prompts | batch | tok/s (median) | range | vs vLLM plain (median of rounds) | acceptance | "
            "accepted per draft | identical |")
    lines = [head, "|" + " --- |" * 9]
    lines += [f"| {r['config']} | {r['prompts']} | {r['batch']} | {r['tokens_per_s']} | "
              f"{'-' if r['rounds'] == 1 else '{}-{}'.format(*r['range'])} | {r['vs_vllm_plain']}x | "
              f"{r['acceptance'] if r['acceptance'] is not None else '-'} | "
              f"{r['accepted_per_draft'] if r['accepted_per_draft'] is not None else '-'} | "
              f"{'yes' if r['identical_to_vllm_plain'] else 'NO'} |" for r in rows]
    (out / "table.md").write_text(f"{json.dumps(meta)}\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(out / "plot.png", rows)


def plot(path: Path, rows: list[dict[str, Any]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[vllm_compare] no matplotlib: no plot (pip install 'specdec[bench]')")
        return
    groups = sorted({(r["prompts"], r["batch"]) for r in rows})
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, ax = plt.subplots(figsize=(2.2 * len(groups) + 3, 4.5))
    width = 0.8 / len(configs)
    for i, config in enumerate(configs):
        values = [next((r["tokens_per_s"] for r in rows if r["config"] == config
                        and (r["prompts"], r["batch"]) == g), 0.0) for g in groups]
        ax.bar([j + i * width for j in range(len(groups))], values, width, label=config)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], [f"{p}\nbatch {b}" for p, b in groups])
    ax.set_ylabel("tokens/s (greedy)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-0.5b", help="a specdec demo model's name or a model directory")
    p.add_argument("--medusa-heads", help="heads from specdec train-medusa (exported for vLLM here)")
    p.add_argument("--medusa-tokens", type=int,
                   help="num_speculative_tokens of the Medusa heads in vLLM (default: one per head)")
    p.add_argument("--eagle", help="a drafter from specdec train-eagle (exported for vLLM here)")
    p.add_argument("--standalone-python", help="the main environment's python: specdec's own loop beside vLLM")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--kv-cache-gib", default="4", help="VLLM_CPU_KVCACHE_SPACE of each engine")
    p.add_argument("--all-cores", action="store_true",
                   help="every core to vLLM's worker (VLLM_CPU_NUM_OF_RESERVED_CPU=0) and numba's own thread pool "
                        "(NUMBA_THREADING_LAYER=workqueue); default: vLLM's thread layout")
    p.add_argument("--prefix-caching", action="store_true",
                   help="vLLM's prefix cache on (off by default: the benchmark repeats its prompts, which a "
                        "prefix cache would not prefill again)")
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds over every configuration, engines up together and interleaved (default 1: one "
                        "engine at a time)")
    p.add_argument("--sets", nargs="+", choices=("generation", "editing"), default=["generation", "editing"])
    p.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    p.add_argument("--out", default="bench/results/vllm_compare")
    p.add_argument("--smoke", action="store_true", help="SmolLM2-135M, one prompt per set, 8 tokens, eager")
    p.add_argument("--configs", nargs="+", metavar="NAME",
                   help="run only these configurations (and vllm_plain, the reference, if --out lacks its result); "
                        "the table takes the others' results already under --out")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--exported-heads", help=argparse.SUPPRESS)
    p.add_argument("--exported-eagle", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rounds < 1 or min(args.batches) < 1:
        p.error("--rounds and --batches take positive numbers")
    if args.smoke and not args.worker:
        args.model, args.max_tokens = "smollm2-135m", 8
    from specdec import models

    args.model_dir = str(models.fetch(args.model)) if args.model in models.REGISTRY else args.model
    return args


if __name__ == "__main__":
    main()
