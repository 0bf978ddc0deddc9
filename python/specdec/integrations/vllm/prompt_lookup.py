"""vLLM proposer: prompt lookup by specdec's ``ngram_match`` op, one call per step for the batch.

Each request's draft copies what followed an earlier occurrence of its context's longest suffix
n-gram (``max_ngram`` down to ``min_ngram`` tokens; by default the earliest occurrence, the
original being edited), as many tokens as its recent acceptance says pay
(:class:`~specdec.integrations.vllm.lengths.DraftLength`).

Example (a script; vLLM's engine is a spawned process, hence the guard)::

    from vllm import LLM, SamplingParams

    if __name__ == "__main__":
        llm = LLM(model="Qwen/Qwen2.5-Coder-0.5B-Instruct", speculative_config={
            "method": "custom_class", "model": "specdec.vllm.PromptLookup",
            "num_speculative_tokens": 8})
        print(llm.generate(["..."], SamplingParams(temperature=0, max_tokens=128)))
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specdec import ops
from specdec.integrations.vllm.lengths import DraftLength
from specdec.integrations.vllm.options import LookupOptions, options_from
from specdec.integrations.vllm.rows import RequestRows, Tracked
from specdec.integrations.vllm.version import check_vllm_version

__all__ = ["PromptLookup", "Request"]


class Request:
    """What a proposer keeps per request: its length policy and its last draft's length."""

    def __init__(self, options: LookupOptions) -> None:
        self.length = DraftLength(options.num_speculative_tokens, options.min_gain)
        self.proposed = 0


def draft_limits(entries: list[Tracked[Any]], sampled_token_ids: list[list[int]],
                 num_tokens: np.ndarray, options: LookupOptions) -> np.ndarray:
    """Per row, the most draft tokens to propose: 0 for rows that sampled nothing this step
    (a prefill chunk, a discarded row) and at the model length; else what the request's policy
    allows, after recording what vLLM accepted of its last draft."""
    limits = np.zeros(len(entries), dtype=np.int64)
    for i, (entry, sampled) in enumerate(zip(entries, sampled_token_ids)):
        request: Request = entry.state
        if not sampled:
            request.proposed = 0
            continue
        request.length.observe(request.proposed, len(sampled) - 1)
        room = options.max_model_len - int(num_tokens[i])
        cap = request.length.limit if options.adaptive else options.num_speculative_tokens
        limits[i] = max(0, min(cap, room))
    return limits


def lookup(token_ids: np.ndarray, num_tokens: np.ndarray, limits: np.ndarray,
           options: LookupOptions) -> tuple[torch.Tensor, np.ndarray]:
    """``ops.ngram_match`` over the first ``len(limits)`` rows (rows with limit 0 look nothing
    up): ``(draft [rows, K], count [rows])``, counts cut to the limits."""
    rows = len(limits)
    context = torch.from_numpy(np.ascontiguousarray(token_ids[:rows]))
    lengths = np.where(limits > 0, num_tokens[:rows], 0).astype(token_ids.dtype)
    draft, count = ops.ngram_match(context, torch.from_numpy(lengths), options.min_ngram, options.max_ngram,
                                   k=options.num_speculative_tokens, earliest=options.earliest)
    return draft, np.minimum(count.numpy(), limits)


def as_lists(draft: torch.Tensor, count: np.ndarray, entries: list[Tracked[Any]]) -> list[list[int]]:
    """vLLM's draft lists; records each request's draft length for the next step."""
    out = []
    for row, (entry, n) in zip(draft.tolist(), zip(entries, count.tolist())):
        entry.state.proposed = n
        out.append(row[:n])
    return out


class PromptLookup:
    """specdec's prompt lookup as a vLLM ``custom_class`` proposer.

    Args:
        vllm_config: the engine's ``VllmConfig`` (vLLM passes it); options: see
            :mod:`specdec.integrations.vllm.options`.
    """

    options_type = LookupOptions

    def __init__(self, vllm_config: Any) -> None:
        check_vllm_version()
        self.options = options_from(vllm_config, self.options_type, type(self).__name__)
        self._requests: RequestRows[Request] = RequestRows(lambda: Request(self.options))

    def load_model(self, model: Any) -> None:
        """No draft model: vLLM calls this with the target, which prompt lookup does not read."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        """Draft tokens for each row of vLLM's batch (an empty list: none)."""
        entries = self._requests.step(token_ids_cpu, num_tokens_no_spec, len(sampled_token_ids))
        limits = draft_limits(entries, sampled_token_ids, num_tokens_no_spec, self.options)
        draft, count = lookup(token_ids_cpu, num_tokens_no_spec, limits, self.options)
        return as_lists(draft, count, entries)
