"""The Medusa decoder on tiny models: greedy identity (static, auto and dynamic trees; B = 1 and
ragged B = 4 with EOS), the sampling distribution, the heads' alignment with the loop's hidden
states, bad input."""

import pytest
import torch
from test_decoders import PROMPTS, assert_greedy_identity, hf_greedy
from tiny_models import tiny_lm

import specdec

CHOICES = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


def random_heads(target, num_heads=3, seed=0, scale=0.5):
    """Heads whose blocks are random: they propose varied, partly right candidates."""
    heads = specdec.MedusaHeads.for_target(target, num_heads, torch.arange(target.config.vocab_size))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.heads.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale / p.shape[-1] ** 0.5)
    return heads


class OracleHeads(torch.nn.Module):
    """Stands in for trained heads: head k proposes what the target's greedy decoding of the
    committed text will emit k + 1 tokens later (read from a precomputed greedy run), as
    rank 0, then two wrong ids. Checks the alignment of hidden states, heads and tree depths."""

    def __init__(self, target, prompt, future):
        super().__init__()
        self.target, self.prompt, self.future = target, prompt, future
        self.hidden_to_pos = {}
        self.rank_accuracy = None
        self.num_heads = 3

    def attach(self, target):
        return self

    def topk(self, hidden, k):
        # Which position is this hidden state? Match it against a plain forward of the text.
        text = self.prompt + self.future
        with torch.no_grad():
            full = self.reference(torch.tensor([text]), output_hidden_states=True).hidden_states[-1][0]
        t = int((full - hidden[0]).abs().amax(-1).argmin())
        ids = torch.full((1, 3, k), 95)
        for head in range(3):
            nxt = t + head + 2  # head k (1-based k = head + 1) predicts token t + k + 1
            ids[0, head, 0] = text[nxt] if nxt < len(text) else 95
            ids[0, head, 1:] = torch.tensor([93, 94][: k - 1])
        return ids, torch.log_softmax(torch.arange(k, 0, -1).float(), 0).expand(1, 3, k)


def oracle_setup():
    """A tiny target, a prompt, the target's next 24 greedy tokens and oracle heads for them."""
    target = tiny_lm("llama", seed=31)
    prompt = PROMPTS[0]
    future = hf_greedy(target, prompt, 24)
    oracle = OracleHeads(target, prompt, future)
    oracle.reference = tiny_lm("llama", seed=31)
    return target, prompt, future, oracle


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
    method = specdec.Medusa(random_heads(target), tree=tree, max_nodes=8, top_k=3)
    assert_greedy_identity(target, PROMPTS, method)


def test_auto_tree_from_accuracies_and_eos():
    target = tiny_lm("llama", seed=33)
    heads = random_heads(target, seed=1)
    heads.rank_accuracy = torch.tensor([[0.6, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.05]])
    eos = hf_greedy(target, PROMPTS[0], 24)[6]
    out = assert_greedy_identity(target, PROMPTS, specdec.Medusa(heads), eos=eos)
    assert out.stats.total_proposed > 0


def test_sampling_follows_the_target_distribution():
    from test_decoders import METHODS, test_sampling_follows_the_target_distribution as check

    METHODS["medusa"] = lambda draft: specdec.Medusa(random_heads(draft, seed=2), tree=CHOICES)
    try:
        check("medusa")
    finally:
        del METHODS["medusa"]


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
    method = specdec.Medusa(random_heads(target), max_nodes=12)
    ctx = lambda costs: Context(torch.zeros(1, 4, dtype=torch.long), torch.tensor([3]),
                                torch.zeros(1, dtype=torch.bool), Sampling(), None, CostModel(costs))
    assert len(method._auto_choices(ctx({1: 10.0, 64: 10.0}))) == 12
    assert len(method._auto_choices(ctx({1: 10.0, 2: 20.0, 16: 160.0}))) <= 2
    assert_greedy_identity(target, PROMPTS[:2], method)
