"""A draft model's chain taking copies (`DraftModel.lookup`): each draft pass also feeds the
tokens copied from the context after the draft's latest one, and takes at once those the draft
would have chosen next."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import Tensor

from specdec import ops
from specdec.loop.protocol import Context, Proposal


def propose_with_lookup(drafter, ctx: Context, scores: Tensor, limit: int, start: float) -> Proposal:
    """The chain of the draft proposer ``drafter``'s `propose`, each draft pass feeding the row's
    latest draft and the tokens that copying the context proposes after it (`DraftModel.lookup`):
    a row takes the draft's choices up to where they leave the copy. A pass is priced for what
    it is expected to add: its own token and the copies the draft took in passes before
    (``drafter.copies_taken``, per copy position). One host read per draft pass. ``scores``:
    the drafts' scores after the tokens committed since the last step; ``start``: when the
    step's drafting began (`time.perf_counter`)."""
    method, sampling = drafter.method, ctx.sampling
    B, device = scores.shape[0], scores.device
    span = limit + drafter.lookup + 1  # a pass may score up to lookup + 1 tokens past the limit
    columns = torch.arange(span, device=device)
    drafted = torch.full((B, span), -1, dtype=torch.int64, device=device)
    # Per drafted token: the chance that it and every draft before it are accepted.
    reaches = torch.zeros(B, span, device=device)
    text = F.pad(ctx.tokens, (0, span))  # the committed tokens, then this step's drafts
    count = torch.zeros(B, dtype=torch.int64, device=device)
    reach = (~ctx.finished).float()
    live, passes, feed = float(reach.sum()), 1, None  # feed: the tokens of the latest pass
    scores = scores[:, None]
    while True:
        width = scores.shape[1]
        slots = count[:, None] + columns[:width]
        choice = drafter.choose(scores, sampling, ctx, ctx.lengths[:, None] + slots)
        taken = torch.ones_like(count)  # the choice after the latest draft, and copies it agrees with
        fed = torch.zeros_like(count)  # copies fed per row
        if feed is not None and width > 1:
            taken += (feed[:, 1:] == choice[:, :-1]).long().cumprod(1).sum(1)
            fed = (feed[:, 1:] >= 0).sum(1)
        taken = torch.minimum(taken, limit - count)
        if feed is not None:  # keep the entries of the fed tokens whose next choice was taken
            for _, cache, _ in drafter.drafts:
                cache.advance(taken)
        kept = columns[:width] < taken[:, None]
        confidence = torch.where(kept, drafter.confidence(scores, choice, sampling), 1.0)
        path = reach[:, None] * confidence.cumprod(1)
        drafted.scatter_(1, slots, torch.where(kept, choice, -1))
        reaches.scatter_(1, slots, torch.where(kept, path, 0.0))
        text.scatter_(1, ctx.lengths[:, None] + slots, choice)
        last = (taken - 1).clamp_min(0)[:, None]
        reach = torch.where(taken > 0, torch.gather(path, 1, last)[:, 0], reach)
        count += taken
        # Next: each row's latest draft, then the copies the limit leaves room for taking.
        copies, n = ops.ngram_match(text, ctx.lengths + count, min_n=1, max_n=3, k=drafter.lookup, earliest=True)
        n = torch.minimum(n, (limit - 1 - count).clamp_min(0))
        feed = torch.cat([torch.gather(drafted, 1, (count - 1)[:, None]),
                          torch.where(columns[: drafter.lookup] < n[:, None], copies, -1)], 1)
        # The next token is taken to be as likely as the latest one (rows at the limit stop).
        gain = (reach * torch.gather(confidence, 1, last)[:, 0] * (count < limit)).sum()
        expected = live + reaches.sum()
        now, gain, drafted_max, drafted_min, copied, *rows = torch.cat([torch.stack([
            expected, gain, count.max().float(), count.min().float(),
            (feed[:, 1:] >= 0).sum(1).max().float()]), (taken - 1).float(), fed.float()]).tolist()
        if passes > 1:  # how many of the copies fed the draft took, by position
            drafter.copies_taken.observe([int(x) for x in rows[:B]], [int(x) for x in rows[B:]])
        # The next pass adds the draft's next token and the copies it is expected to take.
        adds = drafter.copies_taken.expected(int(copied))
        if drafted_min >= limit or (method.adaptive and not ctx.costs.extend_pays(
                int(drafted_max), now, gain * adds, passes, adds=round(adds))):
            break
        passes += 1
        feed = feed[:, : 1 + int(copied)]
        scores = drafter.score(feed.clamp_min(0), None, sampling, commit=False)
    if ctx.tokens.device.type == "cpu":
        ctx.costs.observe_draft((time.perf_counter() - start) * 1e3 / passes)
    best = int(drafted_max)
    if method.adaptive:  # copied tokens may have made the chain longer than its target pass pays for
        gains = reaches[:, :best].sum(0).cumsum(0).tolist()
        best = max(range(1, best + 1), key=lambda w: (live + gains[w - 1]) / ctx.costs.step_ms(w, passes))
    tokens = torch.cat([ctx.roots(), drafted[:, :best]], 1)
    parents = torch.arange(-1, best, device=device).expand_as(tokens)
    return Proposal(tokens, parents)
