"""The engine side of ``bench/vllm_compare.py``: one configuration's process. It starts the
configuration's engine (a vLLM engine, or specdec's own loop), then measures one round of the
prompt sets for each round index the parent writes on its stdin, and answers once the round's
result file is written. vLLM is imported only by the vLLM configurations' processes, so the
standalone ones run in an environment without it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DRAFT_TOKENS = 8
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")
READY, ROUND_DONE = "[vllm_compare worker] ready", "[vllm_compare worker] round done"


@dataclass
class Measure:
    """One configuration on one prompt set at one batch size."""

    config: str
    prompts: str
    batch: int
    tokens: int
    seconds: float
    outputs: list[list[int]]
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    round: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def prompt_sets(smoke: bool, names: Sequence[str] = ("generation", "editing")) -> dict[str, list[str]]:
    from specdec.cli.bench import EDITING_PROMPTS, GENERATION_PROMPTS

    sets = {"generation": GENERATION_PROMPTS, "editing": EDITING_PROMPTS}
    return {name: sets[name][:1] if smoke else sets[name] for name in names}


def token_ids(model_dir: str, prompts: list[str]) -> list[list[int]]:
    """The prompts as the model's chat template writes a user turn (the same ids everywhere)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return [list(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)) for p in prompts]


def requests(ids: list[list[int]], batch: int) -> list[list[list[int]]]:
    """Batch 1: each prompt alone; batch 8: the set's prompts repeated to 8, submitted together."""
    return [[p] for p in ids] if batch == 1 else [[ids[i % len(ids)] for i in range(batch)]]


Round = Callable[[int], list[Measure]]


def vllm_runner(args: argparse.Namespace) -> Round:
    """Start the configuration's engine; the function it returns measures one round with it."""
    from specdec.vllm import eagle_engine_args, medusa_engine_args
    from vllm import LLM, SamplingParams, TokensPrompt

    engine: dict[str, Any] = {}
    spec = {"num_speculative_tokens": DRAFT_TOKENS}
    if args.worker == "vllm_ngram":
        engine["speculative_config"] = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4, **spec}
    elif args.worker == "specdec_prompt_lookup":
        engine["speculative_config"] = {"model": "specdec.vllm.PromptLookup", **spec}
    elif args.worker == "specdec_lookahead":
        engine["speculative_config"] = {"model": "specdec.vllm.Lookahead", **spec}
    elif args.worker == "specdec_medusa_in_vllm":
        engine.update(medusa_engine_args(args.exported_heads, args.model_dir, args.medusa_tokens))
    elif args.worker == "specdec_eagle_in_vllm":
        engine.update(eagle_engine_args(args.exported_eagle, args.model_dir))
    llm = LLM(model=args.model_dir, dtype="float32", max_model_len=4096, enforce_eager=args.smoke,
              enable_prefix_caching=args.prefix_caching, disable_log_stats=False, seed=0, **engine)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], SamplingParams(max_tokens=4), use_tqdm=False)

    def run_round(index: int) -> list[Measure]:
        measures = []
        for name, ids in prompt_ids(args).items():
            for batch in args.batches:
                before = counters(llm)
                outputs, seconds = [], 0.0
                for group in requests(ids, batch):
                    start = time.perf_counter()
                    done = llm.generate([TokensPrompt(prompt_token_ids=p) for p in group], params, use_tqdm=False)
                    seconds += time.perf_counter() - start
                    outputs += [list(o.outputs[0].token_ids) for o in done]
                after = counters(llm)
                delta = [after[k] - before[k] for k in SPEC_COUNTERS]
                measures.append(Measure(args.worker, name, batch, sum(map(len, outputs)), seconds, outputs, *delta,
                                        round=index))
        return measures

    return run_round


def prompt_ids(args: argparse.Namespace) -> dict[str, list[list[int]]]:
    return {name: token_ids(args.model_dir, prompts) for name, prompts in prompt_sets(args.smoke, args.sets).items()}


def counters(llm: Any) -> dict[str, float]:
    values = {m.name: float(m.value) for m in llm.get_metrics() if hasattr(m, "value")}
    return {k: values.get(k, 0.0) for k in SPEC_COUNTERS}


def standalone_runner(args: argparse.Namespace) -> Round:
    """Load the target (and the method's heads or drafter); the function it returns measures one
    round of ``specdec.generate``."""
    import specdec
    import torch
    from specdec import models

    target, tok = models.load(args.model_dir)
    target = specdec.pack_linear_layers(target)
    method = {"standalone_one_token": None, "standalone_prompt_lookup": specdec.PromptLookup()}.get(args.worker)
    if args.worker == "standalone_medusa":
        method = specdec.Medusa(specdec.MedusaHeads.load(args.medusa_heads).attach(target))
    if args.worker == "standalone_eagle":
        method = specdec.Eagle(specdec.EagleDrafter.load(args.eagle))
    eos = tok.eos_token_id
    warm = torch.tensor([[1, 2, 3]])
    specdec.generate(target, warm, max_new_tokens=4, method=method)

    def run_round(index: int) -> list[Measure]:
        measures = []
        for name, ids in prompt_ids(args).items():
            for batch in args.batches:
                outputs, seconds = [], 0.0
                for group in requests(ids, batch):
                    width = max(map(len, group))
                    padded = torch.tensor([[0] * (width - len(p)) + p for p in group])
                    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
                    start = time.perf_counter()
                    out = specdec.generate(target, padded, attention_mask=mask, max_new_tokens=args.max_tokens,
                                           method=method)
                    seconds += time.perf_counter() - start
                    outputs += [until_eos(row[width:].tolist(), eos) for row in out.sequences]
                measures.append(Measure(args.worker, name, batch, sum(map(len, outputs)), seconds, outputs,
                                        round=index))
        return measures

    return run_round


def until_eos(tokens: list[int], eos: int | None) -> list[int]:
    """The tokens up to and including the first EOS (vLLM's output; specdec pads after it)."""
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def worker(args: argparse.Namespace) -> None:
    """A configuration's process: start its engine, then measure one round for each line the parent
    writes (the round's index), answering on stdout once the round's result file is written."""
    run_round = (standalone_runner if args.worker.startswith("standalone") else vllm_runner)(args)
    print(READY, flush=True)
    for line in sys.stdin:
        Path(args.result).write_text(json.dumps([asdict(m) for m in run_round(int(line))]))
        print(ROUND_DONE, flush=True)
