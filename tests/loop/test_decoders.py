"""The decoders on tiny random-weight models: greedy identity with the target's own generate,
batches with ragged acceptance and EOS, and the sampling distribution."""

import dataclasses

import pytest
import torch
from support.decoding import (
    METHODS,
    PROMPTS,
    assert_greedy_identity,
    assert_sampling_follows_the_target_distribution,
    hf_greedy,
)
from support.models import perturbed, tiny_lm

import specdec
from specdec.model.prepare import DotLinear, PackedLinear

MAX_NEW = 24


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_plain_decoding_matches_generate(family, device):
    assert_greedy_identity(tiny_lm(family).to(device), PROMPTS[:2], None)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_draft_that_always_agrees(family):
    target = tiny_lm(family)
    out = assert_greedy_identity(target, PROMPTS[:1], specdec.DraftModel(target, num_draft_tokens=4))
    # Every candidate is accepted: 5 tokens per pass after the prefill.
    assert out.stats.acceptance_rate == 1.0
    assert out.stats.target_forwards <= 1 + -(-(MAX_NEW - 1) // 5)


def test_draft_that_never_agrees():
    target = tiny_lm("llama", seed=0)
    stranger = tiny_lm("llama", seed=123)
    out = assert_greedy_identity(target, PROMPTS[:2], specdec.DraftModel(stranger, num_draft_tokens=3))
    assert out.stats.acceptance_rate < 0.3


@pytest.mark.parametrize("adaptive", [False, True])
def test_draft_that_partly_agrees_batch_ragged(adaptive, device):
    target = tiny_lm("qwen2", seed=1)
    draft = perturbed(target, 0.03, seed=5).to(device)
    target = target.to(device)
    out = assert_greedy_identity(target, PROMPTS, specdec.DraftModel(draft, 4, adaptive=adaptive))
    accepted = torch.stack(out.stats.accepted)
    assert 0.1 < out.stats.acceptance_rate < 1.0
    # Rows accepted different lengths in the same step.
    assert any(len(set(row.tolist())) > 1 for row in accepted)


def test_eos_stops_rows_at_different_times():
    target = tiny_lm("llama", seed=2)
    # An EOS id that one row's greedy output reaches early.
    out0 = hf_greedy(target, PROMPTS[0], MAX_NEW)
    eos = out0[5]
    assert_greedy_identity(target, PROMPTS, specdec.DraftModel(perturbed(target, 0.2, 1), 3), eos=eos)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_prompt_lookup_greedy_identity(family, device):
    target = tiny_lm(family, seed=3).to(device)
    out = assert_greedy_identity(target, PROMPTS, specdec.PromptLookup(max_ngram=3, num_draft_tokens=6,
                                                                       adaptive=False))
    assert out.stats.total_accepted > 0  # the repetitive output gets matched


@pytest.mark.parametrize("name", METHODS)
def test_sampling_follows_the_target_distribution(name):
    """Every sampling-capable method is lossless (support.decoding has the check and its sizes)."""
    assert_sampling_follows_the_target_distribution(METHODS[name])


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_reduced_draft_head_greedy_identity(family):
    target = tiny_lm(family, seed=5)
    method = specdec.DraftModel(perturbed(target, 0.05, 4), 4, adaptive=True, draft_vocab_size=40)
    out = assert_greedy_identity(target, PROMPTS, method)
    assert out.stats.total_accepted > 0


@pytest.mark.parametrize("kernel", ["specdec", "onednn"])
def test_reduced_draft_head_scores_the_lowest_ids(kernel):
    draft = tiny_lm("llama", seed=1)
    method = specdec.DraftModel(draft, draft_vocab_size=5)
    hidden = torch.randn(2, 1, 64)
    want = draft.lm_head(hidden)[..., :5]
    torch.testing.assert_close(method.reduced_head()(hidden), want)
    assert method.reduced_head() is method.reduced_head()  # made once
    specdec.pack_linear_layers(draft, specdec.PackingConfig(kernel=kernel))
    torch.testing.assert_close(method.reduced_head()(hidden), want, rtol=1e-5, atol=1e-6)
    # The reduced head of a prepared head stays prepared, and a draft only proposes: oneDNN's
    # never pads one-row products (the faster path).
    head = method.reduced_head()
    assert type(head) is specdec.model.prepare.DotLinear if kernel == "specdec" else head.min_rows == 1


@pytest.mark.parametrize("kernel", ["specdec", "onednn"])
def test_draft_prepared_for_drafting_keeps_greedy_identity(kernel):
    target = tiny_lm("qwen2", seed=5)
    config = dataclasses.replace(specdec.PackingConfig.for_draft(), kernel=kernel)
    draft = specdec.pack_linear_layers(perturbed(target, 0.05, 4), config)
    prepared = [m for m in draft.modules() if isinstance(m, (DotLinear, PackedLinear))]
    assert prepared and all(type(m) is (DotLinear if kernel == "specdec" else PackedLinear) for m in prepared)
    assert all(m.min_rows == 1 for m in prepared if isinstance(m, PackedLinear))
    method = specdec.DraftModel(draft, 4, adaptive=True, draft_vocab_size=40)
    assert assert_greedy_identity(target, PROMPTS, method).stats.total_accepted > 0


def test_bfloat16_draft_upcast_for_wide_passes_keeps_greedy_identity(monkeypatch):
    # Under oneDNN on a CPU without its bf16 GEMMs, a bf16 draft's prompt and catch-up passes run
    # in float32 (PackingConfig.upcast_rows): its logits then differ by pass width, never the output.
    monkeypatch.setattr(specdec.model.prepare, "bf16_packable", lambda: False)
    target = tiny_lm("qwen2", seed=5)
    draft = perturbed(target, 0.05, 4).to(torch.bfloat16)
    draft = specdec.pack_linear_layers(draft, specdec.PackingConfig.for_draft())  # oneDNN's kernel
    assert any(isinstance(m, specdec.model.prepare.UpcastLinear) for m in draft.modules())
    prompts = [list(range(3, 40)), PROMPTS[0]]  # a prompt past upcast_rows tokens, a short one
    for method in (specdec.DraftModel(draft, 4, adaptive=True),
                   specdec.Ensemble(specdec.PromptLookup(), specdec.DraftModel(draft, 4))):
        assert assert_greedy_identity(target, prompts, method).stats.total_accepted > 0


def test_sampling_is_reproducible_with_a_generator():
    target = tiny_lm("llama", seed=6)
    runs = [specdec.generate(target, torch.tensor([[0, 5, 6]]), max_new_tokens=10, do_sample=True,
                             method=specdec.DraftModel(perturbed(target, 0.3, 2), 3),
                             generator=torch.Generator().manual_seed(7)).sequences for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


def test_bad_arguments():
    target = tiny_lm("llama")
    with pytest.raises(ValueError, match="input_ids"):
        specdec.generate(target, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="max_new_tokens"):
        specdec.generate(target, torch.tensor([[1, 2]]), max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        specdec.generate(target, torch.tensor([[1, 2]]), do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        specdec.DraftModel(target, num_draft_tokens=0)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        specdec.DraftModel(target, draft_vocab_size=0)
    with pytest.raises(ValueError, match="side_tokens"):
        specdec.PromptLookup(side_tokens=-1)
    with pytest.raises(ValueError, match="min_ngram"):
        specdec.PromptLookup(max_ngram=1, min_ngram=2)


def test_accelerated_model_with_tree_attention_and_speccache():
    # pack_linear_layers (prepacked linear layers) under the verify loop: same greedy
    # output as the prepared model's own generate, and tree-pass logits as the unprepared model.
    target = tiny_lm("llama", seed=8)
    reference = tiny_lm("llama", seed=8)
    specdec.pack_linear_layers(target)
    assert_greedy_identity(target, PROMPTS, specdec.DraftModel(perturbed(reference, 0.03, 3), 5))
    from specdec.model.attention import tree_attention_enabled
    from specdec.model.forward import tree_forward
    from specdec.model.prefill import prefill

    tokens, parents = torch.tensor([[7, 8, 9, 10]]), torch.tensor([[-1, 0, 0, 1]])
    logits = []
    for model in (target, reference):
        with torch.no_grad(), tree_attention_enabled(model):
            cache = specdec.SpecCache.for_model(model, 1, 32)
            prefill(model, cache, torch.tensor([PROMPTS[0]]))
            logits.append(tree_forward(model, cache, tokens, parents))
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)


def test_right_padded_batch_gives_the_same_tokens_as_left_padded():
    target = tiny_lm("llama", seed=9)
    method = specdec.PromptLookup(adaptive=False)
    B, S = len(PROMPTS), max(len(p) for p in PROMPTS)
    left, right = torch.full((B, S), 2), torch.full((B, S), 2)
    lmask, rmask = torch.zeros(B, S, dtype=torch.long), torch.zeros(B, S, dtype=torch.long)
    for b, p in enumerate(PROMPTS):
        left[b, S - len(p):], lmask[b, S - len(p):] = torch.tensor(p), 1
        right[b, : len(p)], rmask[b, : len(p)] = torch.tensor(p), 1
    out_l = specdec.generate(target, left, max_new_tokens=12, method=method, attention_mask=lmask)
    out_r = specdec.generate(target, right, max_new_tokens=12, method=method, attention_mask=rmask)
    assert torch.equal(out_l.sequences[:, S:], out_r.sequences[:, S:])
    assert torch.equal(out_r.sequences[:, :S], right)


def test_two_chains_merge_into_one_tree():
    from specdec.proposers.merge import merge_chains

    root = torch.tensor([[0], [0], [0]])
    a = torch.tensor([[5, 6, 7], [5, 6, -1], [-1, -1, -1]])
    b = torch.tensor([[5, 8, 9], [5, 6, -1], [-1, -1, -1]])
    tokens, parents = merge_chains(root, torch.stack([a, b], 1))
    # Row 0: b leaves a after 5: 8 hangs under a's 5 (node 1), 9 under 8. Row 1: b is a.
    assert tokens.tolist() == [[0, 5, 6, 7, 8, 9], [0, 5, 6, -1, -1, -1], [0, -1, -1, -1, -1, -1]]
    assert parents.tolist() == [[-1, 0, 1, 2, 1, 4], [-1, 0, 1, 0, 0, 0], [-1, 0, 0, 0, 0, 0]]


def test_a_third_chain_joins_the_branch_it_shares_a_prefix_with():
    from specdec.proposers.merge import merge_chains

    chains = torch.tensor([[[5, 6, -1], [7, 8, 1], [7, 8, 2]]])
    tokens, parents = merge_chains(torch.tensor([[0]]), chains)
    assert tokens.tolist() == [[0, 5, 6, 7, 8, 1, 2]]
    # 7 starts a second branch under the root; the third chain's 2 hangs under the second's 8.
    assert parents.tolist() == [[-1, 0, 1, 0, 3, 4, 4]]


def test_prompt_lookup_proposes_the_copy_after_a_substituted_token():
    from specdec.loop.cost_model import CostModel
    from specdec.loop.protocol import Context
    from specdec.loop.sampling import Sampling

    # "1 2 3 4 5 6 7 8" was copied as "1 2 9": after the changed token the copy goes on "4 5".
    text = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 9]
    ctx = Context(torch.tensor([text + [0] * 5]), torch.tensor([len(text)]),
                  torch.zeros(1, dtype=torch.bool), Sampling(False), None, CostModel())
    method = specdec.PromptLookup(adaptive=False, num_draft_tokens=4, side_tokens=3)
    proposal = method.start(None, ctx, ctx.tokens, ctx.lengths, 32, None).propose(ctx)
    tokens, parents = proposal.tokens[0].tolist(), proposal.parents[0].tolist()
    # Token 9 never occurred before: the only candidates are the substitution branch's.
    assert tokens == [9, 4, 5, 6] and parents == [-1, 0, 1, 2]
