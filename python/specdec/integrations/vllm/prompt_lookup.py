"""vLLM proposer: prompt lookup by specdec's ``ngram_match`` op, one call per n-gram length per step
for the batch.

Each request's draft copies what followed an earlier occurrence of its context's longest suffix
n-gram (``max_ngram`` down to ``min_ngram`` tokens; by default the earliest occurrence, the
original being edited). The op is called once per n-gram length, longest first, on the rows not
matched yet, so that each draft's match length is known: a longer match is likelier right. Each
step the proposer times the engine's last step and proposes of each draft only what is expected
to pay at the engine's measured prices (:mod:`~specdec.integrations.vllm.lengths`).

Example (a script; vLLM's engine is a spawned process, hence the guard)::

    from vllm import LLM, SamplingParams

    if __name__ == "__main__":
        llm = LLM(model="Qwen/Qwen2.5-Coder-0.5B-Instruct", speculative_config={
            "method": "custom_class", "model": "specdec.vllm.PromptLookup",
            "num_speculative_tokens": 8})
        print(llm.generate(["..."], SamplingParams(temperature=0, max_tokens=128)))
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from specdec import ops
from specdec.integrations.vllm.acceptance import Acceptance
from specdec.integrations.vllm.lengths import DraftSizer
from specdec.integrations.vllm.options import LookupOptions, options_from
from specdec.integrations.vllm.rows import RequestRows, Tracked
from specdec.integrations.vllm.version import check_vllm_version

__all__ = ["PromptLookup", "Request"]


class Request:
    """What a proposer keeps per request: its acceptance counts, its last draft's length and key
    (the length of the match that found it; 0: none), and whether it sampled at the last step
    (False while its prompt is prefilled)."""

    def __init__(self, acceptance: Acceptance) -> None:
        self.acceptance = acceptance
        self.proposed = 0
        self.key = 0
        self.decoding = False


def decoded_only(entries: list[Tracked[Any]], sampled_token_ids: list[list[int]]) -> bool:
    """Whether the step that just ended only decoded: every row sampled at this step and the one
    before, and grew by what it sampled (a request new or coming back, or one that sampled
    nothing at either step, had a prefill chunk in the step)."""
    return all(sampled and e.state.decoding and len(e.tokens) - e.seen == len(sampled)
               for e, sampled in zip(entries, sampled_token_ids))


def draft_limits(entries: list[Tracked[Any]], sampled_token_ids: list[list[int]],
                 num_tokens: np.ndarray, options: LookupOptions, sizer: DraftSizer) -> np.ndarray:
    """Per row, the most draft tokens to propose: 0 for rows that sampled nothing this step
    (a prefill chunk, a discarded row) and at the model length; else ``num_speculative_tokens``,
    after recording what vLLM accepted of the request's last draft."""
    limits = np.zeros(len(entries), dtype=np.int64)
    for i, (entry, sampled) in enumerate(zip(entries, sampled_token_ids)):
        request: Request = entry.state
        request.decoding = bool(sampled)
        if not sampled:
            request.proposed = 0
            continue
        sizer.verified(request.acceptance, request.key, request.proposed, len(sampled) - 1)
        room = options.max_model_len - int(num_tokens[i])
        limits[i] = max(0, min(options.num_speculative_tokens, room))
    return limits


def lookup(token_ids: np.ndarray, num_tokens: np.ndarray, limits: np.ndarray,
           options: LookupOptions) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """``ops.ngram_match`` over the first ``len(limits)`` rows (rows with limit 0 look nothing
    up), once per n-gram length, longest first, on the rows not matched yet: ``(draft [rows, K],
    count [rows], key [rows])``, counts cut to the limits, keys the matched lengths (0: none)."""
    rows = len(limits)
    context = torch.from_numpy(np.ascontiguousarray(token_ids[:rows]))
    lengths = np.where(limits > 0, num_tokens[:rows], 0).astype(token_ids.dtype)
    draft = torch.full((rows, options.num_speculative_tokens), -1, dtype=context.dtype)
    count, key = np.zeros(rows, dtype=np.int64), np.zeros(rows, dtype=np.int64)
    for n in range(options.max_ngram, options.min_ngram - 1, -1):
        if not (lengths > 0).any():
            break
        found, found_count = ops.ngram_match(context, torch.from_numpy(lengths), n, n,
                                             k=options.num_speculative_tokens, earliest=options.earliest)
        hit = found_count.numpy() > 0
        draft[torch.from_numpy(hit)] = found[torch.from_numpy(hit)]
        count[hit], key[hit], lengths[hit] = found_count.numpy()[hit], n, 0
    return draft, np.minimum(count, limits), key


def as_lists(draft: torch.Tensor, count: np.ndarray, key: np.ndarray,
             entries: list[Tracked[Any]]) -> list[list[int]]:
    """vLLM's draft lists; records each request's draft length and key for the next step."""
    out = []
    for row, n, k, entry in zip(draft.tolist(), count.tolist(), key.tolist(), entries):
        entry.state.proposed, entry.state.key = n, k
        out.append(row[:n])
    return out


class PromptLookup:
    """specdec's prompt lookup as a vLLM ``custom_class`` proposer.

    Args:
        vllm_config: the engine's ``VllmConfig`` (vLLM passes it); options: see
            :mod:`specdec.integrations.vllm.options`.
        clock: seconds, read once per step to time vLLM's steps (tests pass their own).
    """

    options_type = LookupOptions

    def __init__(self, vllm_config: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        check_vllm_version()
        self.options = options_from(vllm_config, self.options_type, type(self).__name__)
        opts = self.options
        self.sizer = DraftSizer(opts.max_ngram + 1, opts.num_speculative_tokens, opts.adaptive,
                                opts.explore_every, opts.timed, clock)
        self._requests: RequestRows[Request] = RequestRows(lambda: Request(self.sizer.new_request()))

    def load_model(self, model: Any) -> None:
        """No draft model: vLLM calls this with the target, which prompt lookup does not read."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        """Draft tokens for each row of vLLM's batch (an empty list: none)."""
        entries = self._requests.step(token_ids_cpu, num_tokens_no_spec, len(sampled_token_ids))
        self.sizer.step_ended(decoded_only(entries, sampled_token_ids))
        limits = draft_limits(entries, sampled_token_ids, num_tokens_no_spec, self.options, self.sizer)
        draft, count, key = self.drafts(entries, token_ids_cpu, num_tokens_no_spec, limits)
        decoding = sum(1 for sampled in sampled_token_ids if sampled)
        count = self.sizer.lengths(decoding, [e.state.acceptance for e in entries], key, count)
        return as_lists(draft, count, key, entries)

    def drafts(self, entries: list[Tracked[Request]], token_ids: np.ndarray, num_tokens: np.ndarray,
               limits: np.ndarray) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """Each row's whole draft, at most its limit: ``(draft [rows, K], count, key)`` (see
        :func:`lookup`)."""
        return lookup(token_ids, num_tokens, limits, self.options)
