"""How `generate` serves the rows of a batch: grouped apart from how tokens are chosen."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Batching:
    """Serving options for batches (more than one row); a single row ignores them.

    Attributes:
        max_batch_size: at most this many rows decode at once (default: every row). The other
            rows wait, in order, and take the places of rows that stop (continuous batching:
            a queue of requests, each row's output the same as decoding it alone). Needs
            ``drop_finished`` and a method whose proposers take rows mid-run (every built-in
            one).
        drop_finished: a row that has stopped (EOS, ``max_new_tokens``) leaves the batch after
            the step it stopped in, so later passes run only the rows still going. False:
            stopped rows stay in every pass (as in HF's batched ``generate``).
        share_prefix: leading prompt tokens that several rows have in common (a system prompt,
            few-shot examples) are computed once, by the target and by each draft model, for
            each group where that spares more than ``PASS_TOKENS`` (64) tokens of prefill; rows
            joining a queue copy the cached prefix of a row already in the batch.
        pace: while steps without candidates advance the batch's slowest row (while requests
            wait: all its rows) faster per ms than the method's steps, decode one token per
            pass (`specdec.loop.pacing`). False: the method proposes every step.

    Example:
        >>> Batching(max_batch_size=4)
        Batching(max_batch_size=4, drop_finished=True, share_prefix=True, pace=True)
        >>> Batching(max_batch_size=0)
        Traceback (most recent call last):
        ...
        ValueError: max_batch_size must be >= 1, got 0
    """

    max_batch_size: int | None = None
    drop_finished: bool = True
    share_prefix: bool = True
    pace: bool = True

    def __post_init__(self) -> None:
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
