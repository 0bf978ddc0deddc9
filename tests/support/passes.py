"""Pass helpers shared by the model-layer tests: token trees, a path in one, a packed pass next to
the rectangular one, and a plain forward over the nodes a node sees."""

from __future__ import annotations

import torch

from specdec.model.cache import SpecCache
from specdec.model.forward import forward_pass
from specdec.model.prefill import prefill
from support.ops import random_parents


def path_to(parents: list[int], node: int) -> list[int]:
    path = [node]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    return path[::-1]


def random_tree(B, T, gen):
    return torch.tensor([random_parents(T, gen) for _ in range(B)])


def packed_and_rectangular(model, device, widths, gen, hidden=False):
    """A pass over 3 rows of random trees, rectangular and packed (``widths``), each on its own
    cache after the same ragged prompts; returns both outputs and both caches."""
    T, vocab = 7, model.config.vocab_size
    lens = torch.tensor([9, 4, 12], device=device)
    prompts = torch.randint(0, vocab, (3, 12), generator=gen).to(device)
    tree = torch.randint(0, vocab, (3, T), generator=gen).to(device)
    parents = random_tree(3, T, gen).to(device)
    runs = []
    for w in (None, widths):
        cache = SpecCache.for_model(model, 3, 32)
        with torch.no_grad():
            prefill(model, cache, prompts, lens)
        for layer in cache.layers:  # slots after the prompts that the pass does not write keep this
            for b, n in enumerate(lens.tolist()):
                layer.keys[b, :, n:] = 7.0
        with torch.no_grad():
            out = forward_pass(model, cache, tree, parents, widths=w, return_hidden=hidden)
            out = out if hidden else out.logits
        runs.append((out, cache))
    return runs


def visible_forward(model, committed: list[int], nodes: list[int], positions: list[int],
                    sees: list[list[bool]]) -> torch.Tensor:
    """The target's logits ``[len(sees), V]`` after the last node each mask in ``sees`` shows, run
    plainly by HF (sdpa attention): the committed tokens at 0..n-1 once, into HF's own KV cache,
    then per mask the visible nodes at their own positions, causal among them. One batch,
    right-padded: under the causal mask a row's padding comes after its last token and cannot
    change it."""
    rows = [([t for t, s in zip(nodes, see) if s], [p for p, s in zip(positions, see) if s]) for see in sees]
    width = max(len(tokens) for tokens, _ in rows)
    tokens = torch.tensor([t + [0] * (width - len(t)) for t, _ in rows])
    pos = torch.tensor([p + [0] * (width - len(p)) for _, p in rows])
    last = torch.tensor([len(t) - 1 for t, _ in rows])
    with torch.no_grad():
        cache = model(torch.tensor([committed]), use_cache=True).cache
        cache.batch_repeat_interleave(len(rows))
        logits = model(tokens, position_ids=pos, cache=cache).logits
    return logits[torch.arange(len(rows)), last]
