"""The Medusa decoder on tiny models: greedy identity (static, auto and dynamic trees; B = 1 and
ragged B = 4 with EOS), the sampling distribution, the heads' alignment with the loop's hidden
states, bad input."""

import pytest
import torch
from support.decoding import PROMPTS, assert_greedy_identity, assert_sampling_follows_the_target_distribution, hf_greedy
from support.models import tiny_lm
from support.proposers import CHOICES, oracle_setup, random_heads

import specdec



def test_heads_aligned_with_the_loops_hidden_states():
    target, prompt, future, oracle = oracle_setup()
    out = specdec.generate(target, torch.tensor([prompt]), max_new_tokens=24, eos_token_id=[],
                           method=specdec.Medusa(oracle, tree=[(0,), (0, 0), (0, 0, 0), (1,)]))
    assert out.sequences[0, len(prompt):].tolist() == future
    # Perfect heads: every step accepts its 3-deep chain (4 tokens per pass).
    assert out.stats.target_forwards <= 1 + -(-23 // 4)


@pytest.mark.parametrize("tree", [CHOICES, "dynamic"])
def test_greedy_identity_ragged_batch(tree, device):
    target = tiny_lm("qwen2", seed=32).to(device)
    method = specdec.Medusa(random_heads(target), tree=tree, max_draft_tokens=8, top_k=3)
    assert_greedy_identity(target, PROMPTS, method)


def test_auto_tree_from_accuracies_and_eos():
    target = tiny_lm("llama", seed=33)
    heads = random_heads(target, seed=1)
    heads.rank_accuracy = torch.tensor([[0.6, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.05]])
    eos = hf_greedy(target, PROMPTS[0], 24)[6]
    out = assert_greedy_identity(target, PROMPTS, specdec.Medusa(heads), eos=eos)
    assert out.stats.total_proposed > 0


def test_sampling_follows_the_target_distribution():
    """Medusa's sampling is lossless, by the check every method in METHODS passes."""
    assert_sampling_follows_the_target_distribution(
        lambda draft: specdec.Medusa(random_heads(draft, seed=2), tree=CHOICES))


def test_bad_input():
    target = tiny_lm("llama", seed=34)
    with pytest.raises(ValueError, match="invalid path"):
        specdec.Medusa(random_heads(target), tree=[(0, 1)])
    with pytest.raises(ValueError, match="tree must be"):
        specdec.Medusa(random_heads(target), tree="big")
    other = tiny_lm("llama", seed=34, vocab=64)
    with pytest.raises(ValueError, match="another model"):
        specdec.generate(target, torch.tensor([[1, 2, 3]]), method=specdec.Medusa(random_heads(other), tree=CHOICES))


def test_auto_tree_without_accuracies_uses_the_prior_and_the_costs():
    # Heads without a held-out table (a FasterDecoding checkpoint): the prior table; flat costs
    # (a GPU) grow the tree to max_nodes, steep ones (a CPU's fp32 passes) keep it small.
    from specdec.loop.protocol import Context
    from specdec.loop.cost_model import CostModel
    from specdec.loop.sampling import Sampling

    target = tiny_lm("llama", seed=35)
    method = specdec.Medusa(random_heads(target), max_draft_tokens=12)
    ctx = lambda costs: Context(torch.zeros(1, 4, dtype=torch.long), torch.tensor([3]),
                                torch.zeros(1, dtype=torch.bool), Sampling(), None, CostModel(costs))
    assert len(method._auto_choices(ctx({1: 10.0, 64: 10.0}))) == 12
    assert len(method._auto_choices(ctx({1: 10.0, 2: 20.0, 16: 160.0}))) <= 2
    assert_greedy_identity(target, PROMPTS[:2], method)
