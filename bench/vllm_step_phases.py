"""Where a step of vLLM's CPU engine spends its time: timers around the model runner's phases
(the model's pass, vLLM's rejection sampler, the proposer, ...), split into prefill steps, steps
of one token and steps that carry drafts. Behind docs/integrations.md's decision not to route
vLLM's rejection sampling through specdec's ops.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that the timers, which
wrap vLLM's methods for this measurement only, see its steps. From the repository root, idle:

    LD_PRELOAD=$PWD/.venv-vllm/lib/libiomp5.so .venv-vllm/bin/python bench/vllm_step_phases.py \\
        --config ngram --model qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

PHASES = ("_update_states", "_prepare_inputs", "_model_forward", "sample_tokens", "_sample",
          "_bookkeeping_sync", "propose_draft_token_ids")
SPEC = {"num_speculative_tokens": 8}
CONFIGS = {
    "plain": {},
    "ngram": {"speculative_config": {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4, **SPEC}},
    "specdec": {"speculative_config": {"model": "specdec.vllm.PromptLookup", **SPEC}},
}


class Timers:
    """Seconds and calls per (phase, kind of step)."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, str], float] = collections.defaultdict(float)
        self.calls: dict[tuple[str, str], int] = collections.defaultdict(int)
        self.kind = "one"

    def wrap(self, owner: Any, name: str, label: str | None = None,
             kind_of: Callable[..., str] | None = None) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if kind_of is not None:
                self.kind = kind_of(*args)
            start = time.perf_counter()
            result = inner(*args, **kwargs)
            key = (label or name, self.kind)
            self.seconds[key] += time.perf_counter() - start
            self.calls[key] += 1
            return result

        setattr(owner, name, timed)

    def report(self) -> str:
        rows = sorted(self.seconds, key=lambda key: (key[1], -self.seconds[key]))
        return "\n".join(f"  {kind:8s} {phase:26s} {self.calls[(phase, kind)]:5d} steps "
                         f"{self.seconds[(phase, kind)] * 1e3 / self.calls[(phase, kind)]:8.2f} ms per step"
                         for phase, kind in rows)


def step_kind(_runner: Any, scheduler_output: Any, *_: Any) -> str:
    """A step scheduling over 40 tokens per request is a prompt's (decode steps carry at most
    1 + ``num_speculative_tokens``)."""
    if scheduler_output.total_num_scheduled_tokens > 40 * max(1, len(scheduler_output.num_scheduled_tokens)):
        return "prefill"
    return "drafts" if scheduler_output.scheduled_spec_decode_tokens else "one"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=sorted(CONFIGS), default="ngram")
    p.add_argument("--model", default="qwen2.5-coder-0.5b", help="a specdec demo model's name or a model directory")
    p.add_argument("--prompts", choices=("generation", "editing"), default="editing")
    p.add_argument("--max-tokens", type=int, default=128)
    args = p.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams, TokensPrompt
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from specdec import models

    sys.path.insert(0, str(Path(__file__).parent))
    from vllm_compare import prompt_sets, token_ids

    model_dir = str(models.fetch(args.model)) if args.model in models.REGISTRY else args.model
    timers = Timers()
    timers.wrap(GPUModelRunner, "execute_model", kind_of=step_kind)
    for name in PHASES:
        timers.wrap(GPUModelRunner, name)
    timers.wrap(RejectionSampler, "forward", "RejectionSampler.forward")
    timers.wrap(Sampler, "forward", "Sampler.forward")
    timers.wrap(EngineCore, "step", "the engine's step")
    llm = LLM(model=model_dir, dtype="float32", max_model_len=4096, seed=0, **CONFIGS[args.config])
    llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], SamplingParams(max_tokens=4), use_tqdm=False)
    timers.seconds.clear()
    timers.calls.clear()
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    start, tokens = time.perf_counter(), 0
    for ids in token_ids(model_dir, prompt_sets(False)[args.prompts]):
        done = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
        tokens += len(done[0].outputs[0].token_ids)
    seconds = time.perf_counter() - start
    print(f"{args.config}, {args.prompts}: {tokens} tokens in {seconds:.1f} s, {tokens / seconds:.2f} tok/s")
    print(timers.report())


if __name__ == "__main__":
    main()
