"""Prompts of very different lengths are prefilled in groups of similar lengths (a short prompt
is not padded to the longest): the same cache entries and logits as one pass, fewer tokens."""

import pytest
import torch
from support.decoding import hf_greedy, left_padded, METHODS
from support.models import perturbed, tiny_lm
from support.proposers import CostsAtStart

import specdec
from specdec.model.cache import SpecCache
from specdec.model.attention import enable_tree_attention
from specdec.model.prefill import prefill_pass
from specdec.model.prompt_plan import length_groups, PASS_TOKENS, prefix_offsets, shared_prefixes
from specdec import Batching


def partitions(items: list[int]):
    """Every partition of ``items`` into groups."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for p in partitions(rest):
        yield [[first], *p]
        for i in range(len(p)):
            yield [*p[:i], [first, *p[i]], *p[i + 1:]]


def cost(groups, lengths: list[int], pass_tokens: int) -> int:
    return sum(len(g) * max(lengths[r] for r in g) + pass_tokens for g in groups)


@pytest.mark.parametrize("seed", range(30))
def test_length_groups_is_the_cheapest_split(seed):
    gen = torch.Generator().manual_seed(seed)
    B = int(torch.randint(1, 7, (1,), generator=gen))
    lengths = torch.randint(1, 200, (B,), generator=gen)
    pass_tokens = int(torch.randint(0, 100, (1,), generator=gen))
    groups = length_groups(lengths, pass_tokens)
    rows = sorted(r for g in groups for r in g.tolist())
    assert rows == list(range(B))  # every row once
    n = lengths.tolist()
    best = min(cost(p, n, pass_tokens) for p in partitions(list(range(B))))
    assert cost([g.tolist() for g in groups], n, pass_tokens) == best


PROMPTS = [list(range(3, 63)), [5, 6, 7], list(range(10, 80)), [8, 9], [11, 12, 13, 14, 15]]


def right_padded(prompts: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    S = max(len(p) for p in prompts)
    ids = torch.tensor([p + [0] * (S - len(p)) for p in prompts], device=device)
    return ids, torch.tensor([len(p) for p in prompts], device=device)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("system", [False, True])
def test_prefill_in_groups_fills_the_cache_as_one_pass(family, system, device):
    model = tiny_lm(family).to(device)
    enable_tree_attention(model)
    prompts = [([0, *range(20, 60)] if system else []) + p for p in PROMPTS]
    ids, lengths = right_padded(prompts, device)
    shared = shared_prefixes(ids, lengths) if system else ()
    assert len(shared) == system
    rests = lengths - prefix_offsets(shared, len(prompts), device)
    assert len(length_groups(rests, 16)) > 1  # the long and the short prompts apart
    caches = [SpecCache.for_model(model, len(prompts), ids.shape[1] + 4) for _ in range(2)]
    grouped = prefill_pass(model, caches[0], ids, lengths, return_hidden=True, shared=shared, pass_tokens=16)
    one = prefill_pass(model, caches[1], ids, lengths, return_hidden=True, shared=shared)
    for a, b in zip(grouped, one):  # logits and hidden states, every row in its place
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert torch.equal(caches[0].lengths, lengths) and torch.equal(caches[1].lengths, lengths)
    for a, b in zip(caches[0].layers, caches[1].layers):
        for x, y in ((a.keys, b.keys), (a.values, b.values)):
            for row, n in enumerate(lengths.tolist()):
                torch.testing.assert_close(x[row, :, :n], y[row, :, :n], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", [None, "draft coupled", "draft tree"])
def test_generate_prefills_short_prompts_apart_from_long_ones(name):
    target = tiny_lm("qwen2")
    draft = perturbed(target, 0.05, seed=1)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 96, (n,), generator=gen).tolist() for n in (150, 4, 140, 6)]
    ids, mask = left_padded(prompts)
    models = [target] + ([draft] if name else [])
    shapes = {id(m): [] for m in models}  # [B, T] of every pass
    hooks = [m.get_decoder().register_forward_pre_hook(
        lambda _, args, kwargs, m=m: shapes[id(m)].append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
        for m in models]
    method = None if name is None else METHODS[name](draft)
    out = specdec.generate(target, ids, max_new_tokens=12, method=method, attention_mask=mask, pad_token_id=2,
                           batching=Batching(pace=False))
    for h in hooks:
        h.remove()
    assert 150 + 140 + 2 * PASS_TOKENS < 4 * 150  # two passes cost less than padding every row to 150
    for m in models:  # the target's and the draft's prompt passes: the long rows, then the short
        assert shapes[id(m)][:2] == [(2, 150), (2, 6)]
    for b, p in enumerate(prompts):
        want = hf_greedy(target, p, 12)
        assert out.sequences[b, ids.shape[1]:ids.shape[1] + len(want)].tolist() == want


def test_the_prompts_passes_are_priced_by_the_tokens_they_computed():

    target = tiny_lm("llama")
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 96, (n,), generator=gen).tolist() for n in (150, 4, 140, 6)]
    ids, mask = left_padded(prompts)
    method = CostsAtStart()
    specdec.generate(target, ids, max_new_tokens=2, method=method, attention_mask=mask, pad_token_id=2)
    assert list(method.costs_at_start) == [2 * 150 + 2 * 6]  # not 4 x 150: the short rows ran apart
