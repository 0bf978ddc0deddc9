"""vLLM proposer: prompt lookup, continued from lookahead's n-gram pool.

vLLM verifies one chain of drafts per request, and its target pass has no room for lookahead's
Jacobi window, so inside vLLM the pool is filled with the n-grams of each request's text (the
prompt, then the output as vLLM commits it). A draft is prompt lookup's copy (the longest
matching context, ``ngram_match``), and where that is shorter than the request's draft length
(the copy reached the end of the text, or nothing matched), the pool goes on: the most recent
continuation (N - 1 tokens) of the draft's last token, then of that continuation's last token,
and so on, hopping across the text where a copy stops. The pool's state per request is a
function of the tokens fed to it, so a request keeps an exact pool whichever row of vLLM's batch
it moves to; one pool tensor holds every request's (a slot each), and each step inserts the
batch's new n-grams in one op call and extends the drafts in one lookup per N - 1 tokens.

Example (a script)::

    from vllm import LLM

    if __name__ == "__main__":
        llm = LLM(model="Qwen/Qwen2.5-Coder-0.5B-Instruct",
                  speculative_config={"method": "custom_class", "model": "specdec.vllm.Lookahead",
                                      "num_speculative_tokens": 8},
                  additional_config={"specdec": {"ngram": 4}})
"""

from __future__ import annotations

from typing import Any

import time
from collections.abc import Callable

import numpy as np
import torch

from specdec.ops import NGramPool
from specdec.integrations.vllm.options import LookaheadOptions
from specdec.integrations.vllm.acceptance import Acceptance
from specdec.integrations.vllm.prompt_lookup import PromptLookup, Request
from specdec.integrations.vllm.rows import RequestRows, Tracked

__all__ = ["Lookahead", "PoolSlots"]


class PoolRequest(Request):
    """A request's acceptance counts, last draft, and slot (row) in the shared pool."""

    def __init__(self, acceptance: Acceptance, slot: int) -> None:
        super().__init__(acceptance)
        self.slot = slot


class PoolSlots:
    """One n-gram pool (:class:`specdec.ops.NGramPool`) whose rows are handed out to requests and
    reset when freed. It keeps one continuation per key, the most recent: a chain takes no other.

    Example:
        >>> slots = PoolSlots(vocab=10, n=2, capacity=8)
        >>> a, b = slots.take(), slots.take()
        >>> slots.pool.insert(torch.tensor([[[1, 2]], [[1, 3]]]))
        >>> slots.free(a); slots.take() == a                # a freed slot is reused, empty
        True
        >>> slots.pool.lookup(torch.tensor([1, 1]))[1].tolist()
        [0, 1]
    """

    def __init__(self, vocab: int, n: int, capacity: int) -> None:
        self._sizes = dict(vocab=vocab, n=n, g=1, capacity=capacity, dtype=torch.int32)
        self.pool = NGramPool(0, **self._sizes)
        self._free: list[int] = []

    @property
    def size(self) -> int:
        return self.pool.head.shape[0]

    def take(self) -> int:
        if not self._free:
            grow = max(self.size, 1)
            self._free = list(range(self.size + grow - 1, self.size - 1, -1))
            self.pool.join(NGramPool(grow, **self._sizes))
        return self._free.pop()

    def free(self, slot: int) -> None:
        self.pool.reset([slot])
        self._free.append(slot)


class Lookahead(PromptLookup):
    """Prompt lookup continued from each request's n-gram pool, as a vLLM ``custom_class``
    proposer; options: see :mod:`specdec.integrations.vllm.options`."""

    options_type = LookaheadOptions

    def __init__(self, vllm_config: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(vllm_config, clock)
        opts: LookaheadOptions = self.options  # type: ignore[assignment]
        # Each position of a request adds at most one n-gram: its pool never evicts.
        self._slots = PoolSlots(opts.vocab_size, opts.ngram, opts.max_model_len)
        self._requests = RequestRows(lambda: PoolRequest(self.sizer.new_request(), self._slots.take()),
                                     release=lambda r: self._slots.free(r.slot))

    def drafts(self, entries: list[Tracked[PoolRequest]], token_ids: np.ndarray, num_tokens: np.ndarray,
               limits: np.ndarray) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """Prompt lookup's drafts, each continued from its request's pool up to its limit (the
        key stays the copy's match length; 0 where nothing was copied)."""
        self._insert(entries)
        draft, count, key = super().drafts(entries, token_ids, num_tokens, limits)
        if ((rest := limits - count) > 0).any():
            # The pool goes on from the copy's last token, or the request's where nothing was copied.
            last = [int(draft[i, n - 1]) if n else (int(e.tokens[-1]) if len(e.tokens) else -1)
                    for i, (e, n) in enumerate(zip(entries, count.tolist()))]
            chain, found = self._chains(entries, np.where(rest > 0, last, -1), rest)
            rows, cols = torch.arange(len(entries))[:, None], torch.arange(draft.shape[1])[None, :]
            take = cols < torch.from_numpy(found)[:, None]
            where = torch.from_numpy(count)[:, None] + cols
            draft[rows.expand_as(take)[take], where[take]] = chain[take].to(draft.dtype)
            count = count + found
        return draft, count, key

    def _insert(self, entries: list[Tracked[PoolRequest]]) -> None:
        """Every n-gram of each request's tokens that its pool has not had yet, in text order."""
        n = self.options.ngram  # type: ignore[attr-defined]
        new = [(e.state.slot, e.tokens[max(e.seen - n + 1, 0):]) for e in entries]
        most = max((len(t) - n + 1 for _, t in new), default=0)
        if most <= 0:
            return
        ngrams = torch.full((self._slots.size, most, n), -1, dtype=torch.int32)
        for slot, tokens in new:
            if len(tokens) >= n:
                windows = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int32)).unfold(0, n, 1)
                ngrams[slot, : len(windows)] = windows
        self._slots.pool.insert(ngrams)

    def _chains(self, entries: list[Tracked[PoolRequest]], keys: np.ndarray,
                want: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """Per row, the pool's chain from token ``keys[i]`` (-1: none): the most recent
        continuation of the key, then of that continuation's last token, and so on:
        ``(chain [rows, K], found [rows])``, ``found`` at most ``want``."""
        K = self.options.num_speculative_tokens
        slots = torch.tensor([e.state.slot for e in entries], dtype=torch.long)
        pool_keys = torch.full((self._slots.size,), -1, dtype=torch.int32)
        pool_keys[slots] = torch.from_numpy(np.asarray(keys, dtype=np.int32))
        chain = torch.full((self._slots.size, 0), -1, dtype=torch.int32)
        while chain.shape[1] < K and bool((pool_keys >= 0).any()):
            candidates, count = self._slots.pool.lookup(pool_keys)
            step = torch.where((count > 0)[:, None], candidates[:, 0], -1)
            chain = torch.cat([chain, step], dim=1)
            pool_keys = step[:, -1]
        rows = torch.nn.functional.pad(chain[slots, :K], (0, max(K - chain.shape[1], 0)), value=-1)
        found = (rows >= 0).cumprod(1).sum(1).numpy()
        return rows, np.minimum(found, want)
