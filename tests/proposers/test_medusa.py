"""The Medusa decoder on tiny models: greedy identity (static, auto and dynamic trees; B = 1 and
ragged B = 4 with EOS), the sampling distribution, the heads' alignment with the loop's hidden
states, bad input."""

import pytest
import torch
from support.decoding import PROMPTS, assert_greedy_identity, assert_sampling_follows_the_target_distribution, hf_greedy
from support.models import tiny_lm
from support.proposers import CHOICES, oracle_setup, random_heads

import specdec
from specdec.loop.cost_model import EXPLORE_EVERY



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

    from specdec.proposers.medusa.proposer import AutoSize
    from specdec.proposers.medusa.trees import ranked_paths

    target = tiny_lm("llama", seed=35)
    method = specdec.Medusa(random_heads(target), max_draft_tokens=12)
    ctx = lambda costs: Context(torch.zeros(1, 4, dtype=torch.long), torch.tensor([3]),
                                torch.zeros(1, dtype=torch.bool), Sampling(), None, CostModel(costs))
    auto = AutoSize(*ranked_paths(method.accuracy_table(), method.max_draft_tokens))
    assert auto.size(ctx({1: 10.0, 64: 10.0}), 12) == 12
    assert auto.size(ctx({1: 10.0, 2: 20.0, 16: 160.0}), 12) <= 2
    assert_greedy_identity(target, PROMPTS[:2], method)


WEAK = [[0.3, 0.1, 0.05], [0.2, 0.05, 0.02], [0.1, 0.03, 0.01]]  # a held-out table: heads k = 1..3, ranks 0..2


def _auto_run(monkeypatch, target_ms, claimed, max_draft_tokens=12, new=24):
    """Medusa with its defaults (tree "auto", no pass_costs) on a synthetic clock: the tokens
    each step proposed per row."""
    from support.clock import SyntheticClock

    target = tiny_lm("llama", seed=34)
    heads = random_heads(target, seed=2)
    heads.rank_accuracy = torch.tensor(claimed)
    clock = SyntheticClock(target, target_ms=target_ms).install(monkeypatch)
    prompt = torch.tensor([PROMPTS[2]])
    out = specdec.generate(target, prompt, max_new_tokens=new,
                           method=specdec.Medusa(heads, max_draft_tokens=max_draft_tokens))
    clock.remove()
    want = hf_greedy(target, PROMPTS[2], new)  # up to the model's EOS
    assert out.sequences[0, prompt.shape[1]:prompt.shape[1] + len(want)].tolist() == want
    return [int(p[0]) for p in out.stats.proposed]


def test_auto_tree_falls_back_to_one_token_where_wider_passes_do_not_pay(monkeypatch):
    # Every extra token costs two thirds of a one-token pass: no tree of these heads pays. The
    # first step (nothing measured) tries 12 nodes; its cost, and a one-token pass's, measured,
    # every later step verifies none.
    proposed = _auto_run(monkeypatch, lambda tokens: 10.0 + 20.0 * tokens, WEAK)
    assert proposed[0] == 12 and proposed[1:] and not any(proposed[1:])


def test_auto_tree_grows_to_the_cap_where_passes_cost_the_same(monkeypatch):
    # The first step tries 7 nodes; below that width a pass is priced by its tokens until
    # measured, so the second step measures one token; from then on every step takes all 7.
    proposed = _auto_run(monkeypatch, lambda tokens: 30.0, WEAK, max_draft_tokens=7)
    assert proposed[:2] == [7, 0] and set(proposed[2:]) == {7}


def test_auto_tree_shrinks_when_heads_are_accepted_less_than_their_table_says(monkeypatch):
    # The table claims near-certain heads; these random ones are rarely right. Passes cost a
    # little more per token: what pays for the claimed accuracy stops paying for the measured one.
    # (Taken at their word, the whole 12 nodes would pay at these costs.)
    # (Exploration steps take the table at its word again, and propose more.)
    high = [[0.95, 0.9, 0.85], [0.9, 0.85, 0.8], [0.85, 0.8, 0.75]]
    proposed = _auto_run(monkeypatch, lambda tokens: 30.0 + 5.0 * tokens, high, new=40)
    assert proposed[0] == 12 and max(n for i, n in enumerate(proposed[3:], 4) if i % EXPLORE_EVERY) < 6


def test_auto_tree_measures_again_after_unlucky_steps(monkeypatch):
    # Heads whose table claims near-certain candidates that are never right, at costs where
    # they would pay if they were: once measured, the tree shrinks to nothing, and every
    # EXPLORE_EVERY steps the table is taken at its word again, so the heads keep being measured.
    high = [[0.95, 0.9, 0.85], [0.9, 0.85, 0.8], [0.85, 0.8, 0.75]]
    proposed = _auto_run(monkeypatch, lambda tokens: 10.0 + 20.0 * tokens, high, new=40)
    explored = [n for i, n in enumerate(proposed, 1) if i % EXPLORE_EVERY == 0]
    others = [n for i, n in enumerate(proposed, 1) if i % EXPLORE_EVERY and i > 2]
    assert explored and all(explored) and not any(others)
