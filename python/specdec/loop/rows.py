"""The rows in a batch: rows that stop leave it between steps, and with a queue of requests
(`generate`'s ``max_batch_size``) waiting rows take their places (continuous batching)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.model.cache import SpecCache
from specdec.loop.protocol import Context, Proposer


@dataclass
class Started:
    """Rows just started on their own: their context, cache, proposer and emitted counts."""

    ctx: Context
    cache: SpecCache
    proposer: Proposer | None
    generated: Tensor


class BatchRows:
    """The rows decoding now (``ctx``, their emitted counts ``generated``) among ``total`` rows,
    of which ``waiting`` (ids, in order) have not started. With ``drop``, rows that stopped
    leave between steps, their committed tokens kept here for the output."""

    def __init__(self, ctx: Context, generated: Tensor, total: int, waiting: Tensor, drop: bool) -> None:
        self.ctx, self.generated, self.waiting, self.drop = ctx, generated, waiting, drop
        device = generated.device
        self.tokens = ctx.tokens.new_zeros(total, ctx.tokens.shape[1])  # every row, as given
        self.all_generated = torch.zeros(total, dtype=generated.dtype, device=device)
        self.ids = torch.arange(generated.shape[0], device=device)  # each row's index there
        self.free = 0  # places for waiting rows after `going`

    def going(self, cache: SpecCache, proposer: Proposer | None, rows_at_once: int) -> bool:
        """Whether any row is going or waiting (one host read); counts the places free for
        waiting rows and drops the rows that stopped, after the rows taking their places have
        joined when some do (`join`: a joining row may copy the cached prompt prefix of a row
        that stopped)."""
        ctx = self.ctx
        live = int((~ctx.finished).sum())
        rows = ctx.finished.shape[0]
        leaving = self.drop and live < rows and (live > 0 or self.waiting.numel() > 0)
        if leaving:
            rows = live
        self.free = min(max(rows_at_once - rows, 0), self.waiting.numel())
        if leaving and not self.free:
            self._keep((~ctx.finished).nonzero()[:, 0], cache, proposer)
        self.ctx.costs.rows = rows + self.free  # the batch's passes to come (joining rows price theirs)
        return live > 0 or self.waiting.numel() > 0

    def join(self, started: Started, ids: Tensor, cache: SpecCache, proposer: Proposer | None) -> None:
        """Appends rows ``ids`` (taken from the front of ``waiting``) started on their own
        (their context, cache, proposer and emitted counts) to the batch, and drops the batch's
        rows that stopped."""
        ctx, theirs, their_proposer, generated = started.ctx, started.cache, started.proposer, started.generated
        before = self.ctx.finished
        self.waiting = self.waiting[ids.numel():]
        self.ids = torch.cat([self.ids, ids])
        self.generated = torch.cat([self.generated, generated])
        self.ctx = dataclasses.replace(self.ctx, tokens=torch.cat([self.ctx.tokens, ctx.tokens]),
                                       lengths=torch.cat([self.ctx.lengths, ctx.lengths]),
                                       finished=torch.cat([self.ctx.finished, ctx.finished]))
        cache.join(theirs)
        if self.ctx.streams is not None:
            self.ctx.streams.join(ctx.streams)
        if proposer is not None:
            proposer.join(their_proposer)
        if self.drop and bool(before.any()):
            joined = torch.arange(before.shape[0], self.ctx.finished.shape[0], device=before.device)
            self._keep(torch.cat([(~before).nonzero()[:, 0], joined]), cache, proposer)

    def _keep(self, keep: Tensor, cache: SpecCache, proposer: Proposer | None) -> None:
        """Keeps only the rows ``keep`` (in that order), the others' tokens written back."""
        self._write_back()
        ctx = self.ctx
        self.ids, self.generated = self.ids[keep], self.generated[keep]
        self.ctx = dataclasses.replace(ctx, tokens=ctx.tokens[keep], lengths=ctx.lengths[keep],
                                       finished=ctx.finished[keep])
        cache.keep_rows(keep)
        for part in (ctx.streams, proposer):
            if part is not None:
                part.keep_rows(keep)

    def every_row_of(self, values: Tensor) -> Tensor:
        """``[total]`` per-row values of the rows in the batch, 0 for the others."""
        if values.shape[0] == self.all_generated.shape[0]:  # every row, none left, none waiting: as given
            return values
        return values.new_zeros(self.all_generated.shape).index_copy_(0, self.ids, values)

    def every_row(self) -> tuple[Tensor, Tensor]:
        """Committed tokens ``[total, capacity]`` and new-token counts ``[total]`` of every row."""
        self._write_back()
        return self.tokens, self.all_generated

    def _write_back(self) -> None:
        self.tokens[self.ids] = self.ctx.tokens
        self.all_generated[self.ids] = self.generated
