"""Prefix sharing: a prompt prefix every row of a batch has in common is computed once (by the
target and by each draft) and copied into every row; outputs stay those of the rows run apart."""

import pytest
import torch
from support.decoding import hf_greedy, left_padded, METHODS
from support.models import perturbed, tiny_lm
from support.proposers import CostsAtStart

import specdec
from specdec.model.cache import SpecCache
from specdec.model.attention import enable_tree_attention
from specdec.model.prefill import prefill, prefill_pass
from specdec.model.prompt_plan import PASS_TOKENS, shared_prefixes, SharedPrefix
from specdec import Batching

SYSTEM = [0, *range(20, 60)]  # 41 tokens every row starts with
QUESTIONS = [[5, 17, 33, 5, 17], [40], [9, 9, 9, 61, 70, 71, 72, 9], [3, 4]]


def rows_of(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and lengths."""
    S = max(len(p) for p in prompts)
    return torch.tensor([p + [0] * (S - len(p)) for p in prompts]), torch.tensor([len(p) for p in prompts])


def test_shared_prefixes_group_the_rows_that_start_alike():
    ids, lengths = rows_of([[1, 2, 3, 4], [1, 2, 3, 5, 6], [1, 2, 3, 4, 7]])
    assert shared_prefixes(ids, lengths) == (SharedPrefix((0, 1, 2), 3),)
    # Identical prompts: every row keeps its last token for its own pass.
    same = torch.tensor([[1, 2, 3, 4]] * 3)
    assert shared_prefixes(same, torch.tensor([4, 4, 4])) == (SharedPrefix((0, 1, 2), 3),)
    assert shared_prefixes(same, torch.tensor([4, 2, 4])) == (SharedPrefix((0, 2), 3),)
    assert shared_prefixes(*rows_of([[1, 2], [3, 2]])) == ()
    # Two system prompts, rows interleaved; a row of its own. Each group is formed when it
    # spares more than min_saved tokens: A's 3 rows x 50 tokens spare 100, B's 2 rows x 40 spare 40.
    a, b = list(range(10, 60)), list(range(100, 140))
    prompts = [a + [1], b + [2], a + [3, 4], b + [5], a + [6], [7, 8]]
    assert shared_prefixes(*rows_of(prompts)) == (SharedPrefix((0, 2, 4), 50), SharedPrefix((1, 3), 40))
    assert shared_prefixes(*rows_of(prompts), min_saved=64) == (SharedPrefix((0, 2, 4), 50),)
    # A short common start does not glue the groups together: sharing each whole prompt spares more.
    c, d = [9, 9] + list(range(200, 280)), [9, 9] + list(range(300, 380))
    assert shared_prefixes(*rows_of([c + [1], d + [2], c + [3], d + [4]]), min_saved=64) == (
        SharedPrefix((0, 2), 82), SharedPrefix((1, 3), 82))


@pytest.mark.parametrize("all_hidden", [False, True])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_prefill_with_a_shared_prefix_fills_the_cache_as_a_full_prefill(family, all_hidden, device):
    model = tiny_lm(family).to(device)
    enable_tree_attention(model)
    prompts = [SYSTEM + q for q in QUESTIONS]
    S = max(len(p) for p in prompts)
    ids = torch.tensor([p + [0] * (S - len(p)) for p in prompts], device=device)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    groups = shared_prefixes(ids, lengths)
    assert groups == (SharedPrefix((0, 1, 2, 3), len(SYSTEM)),)
    shared = len(SYSTEM)
    caches = [SpecCache.for_model(model, len(prompts), S + 4) for _ in range(2)]
    # all_hidden: every prompt token's hidden state (EAGLE's drafter reads them), the shared
    # prefix's from its one-row pass; zeros past each row's length.
    with_sharing = prefill_pass(model, caches[0], ids, lengths, shared=groups, return_hidden=True,
                                all_hidden=all_hidden)
    without = prefill_pass(model, caches[1], ids, lengths, return_hidden=True, all_hidden=all_hidden)
    for a, b in zip(with_sharing, without):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    if all_hidden:
        assert with_sharing.hidden.shape == (len(prompts), S, model.config.hidden_size)
        past = torch.arange(S, device=device) >= lengths[:, None]
        assert bool((with_sharing.hidden[past] == 0).all()) and bool((with_sharing.hidden[~past] != 0).any(-1).all())
    assert torch.equal(caches[0].lengths, caches[1].lengths)
    for a, b in zip(caches[0].layers, caches[1].layers):
        for x, y in ((a.keys, b.keys), (a.values, b.values)):
            for row, n in enumerate(lengths.tolist()):
                torch.testing.assert_close(x[row, :, :n], y[row, :, :n], atol=1e-5, rtol=1e-5)
            # The shared entries are one computation's copies: equal bit for bit in every row.
            assert torch.equal(x[:, :, :shared], x[:1, :, :shared].expand_as(x[:, :, :shared]))


@pytest.mark.parametrize("name", [None, *METHODS])
def test_greedy_output_is_that_of_the_rows_run_apart(name):
    target = tiny_lm("llama")
    draft = perturbed(target, 0.05, seed=1)
    prompts = [SYSTEM + q for q in QUESTIONS]
    ids, mask = left_padded(prompts)
    method = None if name is None else METHODS[name](draft)
    out = specdec.generate(target, ids, max_new_tokens=16, method=method, attention_mask=mask,
                           pad_token_id=2, batching=Batching(pace=False))
    assert out.stats.shared_prefixes == (SharedPrefix((0, 1, 2, 3), len(SYSTEM)),)
    for b, p in enumerate(prompts):
        want = hf_greedy(target, p, 16)
        assert out.sequences[b, ids.shape[1]:ids.shape[1] + len(want)].tolist() == want


def test_the_draft_computes_the_prefix_once_too():
    target = tiny_lm("qwen2")
    draft_model = perturbed(target, 0.05, seed=1)
    prompts = [SYSTEM + q for q in QUESTIONS]
    ids, mask = left_padded(prompts)
    outs, passes = [], []
    for share in (True, False):
        shapes = []  # [B, T] of every pass of the draft
        hook = draft_model.get_decoder().register_forward_pre_hook(
            lambda _, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
        outs.append(specdec.generate(target, ids, max_new_tokens=12, method=specdec.DraftModel(draft_model, 3),
                                     attention_mask=mask, pad_token_id=2, batching=Batching(pace=False, share_prefix=share)))
        hook.remove()
        passes.append(shapes)
    assert [len(o.stats.shared_prefixes) for o in outs] == [1, 0]
    longest = max(len(q) for q in QUESTIONS)
    # The draft's prompt passes: the prefix for one row, then the questions for all rows; or
    # the whole prompts for all rows.
    assert passes[0][:2] == [(1, len(SYSTEM)), (4, longest)]
    assert passes[1][0] == (4, len(SYSTEM) + longest)
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    # The draft proposed the same tokens from its shared prefix as from its full prefill.
    assert outs[0].stats.total_accepted == outs[1].stats.total_accepted


def test_prefix_is_shared_only_when_it_spares_enough_prefill():
    target = tiny_lm("llama")
    short = [[0, 20, 21, 22] + q for q in QUESTIONS]  # 3 rows x 4 tokens spared: not worth a pass
    ids, mask = left_padded(short)
    assert 3 * 4 < PASS_TOKENS
    out = specdec.generate(target, ids, max_new_tokens=4, attention_mask=mask, pad_token_id=2)
    assert out.stats.shared_prefixes == ()
    one = specdec.generate(target, torch.tensor([SYSTEM + [5]]), max_new_tokens=4)
    assert one.stats.shared_prefixes == ()  # one row: nothing to share


def test_bad_shared_lengths_get_clear_errors():
    model = tiny_lm("llama")
    enable_tree_attention(model)
    ids = torch.tensor([[1, 2, 3], [1, 2, 4]])
    with pytest.raises(ValueError, match="shared prefix"):
        prefill(model, SpecCache.for_model(model, 2, 8), ids, torch.tensor([3, 2]),
                shared=[SharedPrefix((0, 1), 2)])
    with pytest.raises(ValueError, match="cached one"):
        prefill(model, SpecCache.for_model(model, 2, 8), ids, torch.tensor([3, 2]), cached=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="cannot be combined"):
        prefill(model, SpecCache.for_model(model, 2, 8), ids, shared=[SharedPrefix((0, 1), 2)],
                cached=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="one row or one per row"):  # 3 rows into 2
        SpecCache.for_model(model, 2, 8).copy_row(SpecCache.for_model(model, 3, 8))


def test_the_prompts_pass_is_priced_by_the_rows_own_tokens():
    # The batch's first cost point is its prompt's passes, over the tokens they computed: with a
    # shared prefix, the prefix once and the rows' own parts batched (shared + B x (S - shared)
    # tokens), not B x S. (Without the prefix's tokens, rows that share all but their last
    # token priced a whole prefill as a pass over B tokens.)
    target = tiny_lm("llama")
    prompts = [SYSTEM + q for q in QUESTIONS]
    ids, mask = left_padded(prompts)
    shared = len(SYSTEM) + len(prompts) * (ids.shape[1] - len(SYSTEM))
    for share, tokens in ((True, shared), (False, ids.numel())):
        method = CostsAtStart()
        specdec.generate(target, ids, max_new_tokens=2, method=method, attention_mask=mask, pad_token_id=2,
                         batching=Batching(share_prefix=share))
        assert list(method.costs_at_start) == [tokens]


def test_two_system_prompts_each_computed_once():
    # Rows in turn with two system prompts: each prefix runs once (target and draft), and each
    # row's output is that of the row run apart.
    target = tiny_lm("llama")
    draft_model = perturbed(target, 0.05, seed=1)
    other = [0, *range(60, 95)]  # 36 tokens, 3 rows: 2 x 36 spared
    prompts = [(SYSTEM if b % 2 == 0 else other) + QUESTIONS[b % 4] for b in range(6)]
    ids, mask = left_padded(prompts)
    shapes = []
    hook = draft_model.get_decoder().register_forward_pre_hook(
        lambda _, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    out = specdec.generate(target, ids, max_new_tokens=12, method=specdec.DraftModel(draft_model, 3),
                           attention_mask=mask, pad_token_id=2, batching=Batching(pace=False))
    hook.remove()
    assert out.stats.shared_prefixes == (SharedPrefix((0, 2, 4), len(SYSTEM)), SharedPrefix((1, 3, 5), len(other)))
    assert shapes[:2] == [(1, len(SYSTEM)), (1, len(other))] and shapes[2][0] == 6
    for b, p in enumerate(prompts):
        want = hf_greedy(target, p, 12)
        assert out.sequences[b, ids.shape[1]:ids.shape[1] + len(want)].tolist() == want


def test_a_row_in_no_group():
    # The rows' rest runs as one pass after each row's prefix: an unrelated long prompt next to
    # grouped rows needs cache room past the padded prompt width (the group's prefix + its length).
    target = tiny_lm("qwen2")
    prompts = [SYSTEM + q for q in QUESTIONS[:3]] + [list(range(60, 95))]
    ids, mask = left_padded(prompts)
    out = specdec.generate(target, ids, max_new_tokens=6, attention_mask=mask,
                           pad_token_id=2, batching=Batching(pace=False))
    assert out.stats.shared_prefixes == (SharedPrefix((0, 1, 2), len(SYSTEM)),)
    for b, p in enumerate(prompts):
        want = hf_greedy(target, p, 6)
        assert out.sequences[b, ids.shape[1]:ids.shape[1] + len(want)].tolist() == want
