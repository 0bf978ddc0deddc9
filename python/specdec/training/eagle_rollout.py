"""An EAGLE drafter drafting from its own features, as decoding drafts: :func:`rollout` (the
predicted features at depths 1..d from every position of a chunk, in d passes; what the
training's test of deeper depths learns from) and :func:`evaluate` (the held-out per-rank
accuracy table, as Medusa's per head)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from specdec.proposers.eagle.drafter import EagleDrafter
from specdec.proposers.medusa.heads import RANKS
from specdec.training.features import Features

__all__ = ["evaluate", "rollout"]


def rollout(drafter: EagleDrafter, ids: Tensor, hidden: Tensor, depth: int, greedy: Tensor | None = None,
            ) -> list[Tensor]:
    """The features the drafter predicts over one chunk when it drafts from its own features,
    for depths 1 .. ``depth``: entry ``[s]`` of the d-th tensor (``[n - d, H]``) is the feature
    predicted at depth d by a draft that starts after the chunk's position s + 1, i.e. from
    ``(f_s, x_{s+1})``; it scores the token for position s + d + 1, whose target is the
    target's ``labels[s + d]`` (so depth d is comparable with Medusa's head d at position s),
    and its feature target is ``f_{s+d}``.

    ``ids [n]``: the chunk's tokens ``x``; ``hidden [n, H]``: the target's features ``f``. Or a
    batch of chunks, right-padded: ``ids [B, n]``, ``hidden [B, n, H]`` (``greedy [B, n]``),
    giving ``[B, n - d, H]`` per depth; padding never reaches a real entry (a start sees
    positions up to its own only). Differentiable: the held-out accuracy
    (:func:`evaluate`) runs it without gradients, the training's test of depths 2 and beyond
    (:func:`specdec.training.eagle.train_eagle`) with them, through the fed-back features and
    the cache.

    As in decoding, a draft starting at s runs on the drafter's cache of the real entries
    ``(f_j, x_{j+1})``, j <= s, and then feeds itself: its depth-d entry (d >= 2) sits at
    position s + d - 1 and reads the feature its depth-(d-1) entry predicted together with the
    token for position s + d: the text's ``x_{s+d}``, the token the target's label
    ``labels[s + d]`` was computed after (with ``greedy``, the target's labels, instead
    ``greedy[s + d - 1]``: its greedy path, the text's token where a label is -1; but where the
    text leaves that path, the label that entry is scored against follows the text, not the
    token it was fed). So pass d runs the depth-d entries of all starts at once, each shifted
    one position right of its depth-(d-1) entry and reading that entry's output, on a KV cache
    holding the passes before, under a mask that lets the entry of start s see the real entries
    j <= s and the deeper entries of its own start only: exactly what a draft from s would
    compute alone, for every s in d passes.

    Example (the predictions of depth 2 are those of a draft started alone):
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> target = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...                                       num_hidden_layers=1, num_attention_heads=4)).eval()
        >>> drafter = EagleDrafter.for_target(target)
        >>> x = torch.tensor([3, 9, 4, 7, 5, 8])
        >>> f = target.model(x[None]).last_hidden_state[0].detach()
        >>> with torch.no_grad():
        ...     depth1, depth2 = rollout(drafter, x, f, depth=2)
        ...     s = 2  # a draft from (f_2, x_3): the real entries 0..2, then its prediction with x_4
        ...     first = drafter(x[None, 1:s + 2], f[None, :s + 1])[0, -1]
        ...     second = drafter(x[None, 1:s + 3], torch.cat([f[:s + 1], first[None]])[None])[0, -1]
        >>> torch.allclose(depth1[s], first, atol=1e-5), torch.allclose(depth2[s], second, atol=1e-5)
        (True, True)
    """
    from transformers import DynamicCache

    if ids.dim() == 1:
        chunk = None if greedy is None else greedy[None]
        return [p[0] for p in rollout(drafter, ids[None], hidden[None], depth, chunk)]
    device = drafter.fc.weight.device
    n = ids.shape[1]
    x, f = ids.to(device), hidden.to(device, drafter.dtype)
    feed = x[:, 1:]  # feed[:, j]: the token for position j + 1
    if greedy is not None:
        g = greedy.to(device).long()[:, :-1]
        feed = torch.where(g >= 0, g, feed)
    decoder = drafter.model.get_decoder()
    cache = DynamicCache(config=drafter.model.config)
    key_start: list[Tensor] = []  # per cached entry: the start s of its draft, and its depth
    key_depth: list[Tensor] = []
    predicted: list[Tensor] = []
    for d in range(1, depth + 1):
        m = n - d  # starts s = 0 .. n - 1 - d have a target at depth d (labels[s + d])
        if m < 1:
            break
        s = torch.arange(m, device=device)
        if d == 1:
            tokens, features = x[:, 1:], f[:, :-1]                           # the real entries (f_s, x_{s+1})
        else:
            tokens, features = feed[:, d - 1: d - 1 + m], predicted[-1][:, :m]  # (own f_{s+d-1}, token for s + d)
        key_start.append(s)
        key_depth.append(torch.full((m,), d, device=device))
        starts, depths = torch.cat(key_start), torch.cat(key_depth)
        # Start s sees the real entries up to its own and the entries of its own draft.
        mask = torch.where(depths == 1, starts <= s[:, None], starts == s[:, None])
        out = decoder(inputs_embeds=drafter.inputs(tokens, features), attention_mask=mask[None, None],
                      position_ids=(s + d - 1)[None], cache=cache, use_cache=True)
        predicted.append(out.last_hidden_state)
    return predicted


@torch.no_grad()
def evaluate(drafter: EagleDrafter, ids: Tensor, features: Features, depth: int = 5,
             head: Callable[[Tensor], Tensor] | None = None, greedy_path: bool = False) -> tuple[Tensor, int]:
    """The per-rank accuracy table ``[depth, RANKS]`` over the held-out chunks of
    ``features`` (``ids``: the chunks' tokens, concatenated), drafting from the drafter's own
    features (:func:`rollout`): entry ``[d - 1, r]`` is the share of positions where the
    rank-r candidate at depth d is the target's token (targets outside the drafter's vocabulary
    count as misses), as Medusa's table per head; and the number of positions at depth 1.
    ``head``: the scores (default: ``drafter.logits``). ``greedy_path``: deeper entries read the
    target's greedy tokens instead of the text's (:func:`rollout`)."""
    head = head or drafter.logits
    k = min(RANKS, drafter.config.draft_vocab_size)
    hits = torch.zeros(depth, RANKS)
    valid = torch.zeros(depth)
    was_training = drafter.training
    drafter.eval()
    for c in range(len(features.heldout)):
        if not features.heldout[c]:
            continue
        span = slice(int(features.offsets[c]), int(features.offsets[c + 1]))
        labels = features.labels[span].long()
        greedy = labels if greedy_path else None
        for d, predicted in enumerate(rollout(drafter, ids[span], features.hidden[span], depth, greedy), 1):
            target = labels[d: d + len(predicted)]
            top = drafter.vocab_ids[head(predicted).topk(k, -1).indices].cpu()  # as target ids
            hits[d - 1, :k] += (top == target[:, None]).sum(0)  # -1 (not learned) matches nothing
            valid[d - 1] += (target >= 0).sum()
    drafter.train(was_training)
    return hits / valid.clamp_min(1)[:, None], int(valid[0])
