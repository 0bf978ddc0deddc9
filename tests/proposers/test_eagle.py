"""The EAGLE decoder on tiny models: the drafter's alignment with the target's hidden states
(an oracle drafter, and every committed entry pairing f_t with x_{t+1}), greedy identity (trees
and chains, ragged batches, ensembles, reduced vocabularies), bad input. The sampling
distribution, seeded equality, queues and finished rows run over support.decoding.METHODS."""

import pytest
import torch
from support.decoding import PROMPTS, assert_greedy_identity, hf_greedy, left_padded
from support.models import bigram_target, oracle_drafter, random_drafter, tiny_lm

import specdec
from specdec import EagleDrafter


@pytest.mark.parametrize("tree", [None, "dynamic"])
def test_oracle_drafter_is_accepted_whole(tree):
    # Pairing entry t with token t + 1 (not t) and depth d's position with its parent's: any
    # shift makes the oracle predict the wrong token and the chain is cut at once.
    target = bigram_target()
    prompt, new = PROMPTS[0], 31
    method = specdec.Eagle(oracle_drafter(target), tree=tree, max_draft_tokens=5, adaptive=False, top_k=2,
                           tree_nodes=10)
    out = specdec.generate(target, torch.tensor([prompt]), max_new_tokens=new, eos_token_id=[], method=method)
    assert out.sequences[0, len(prompt):].tolist() == hf_greedy(target, prompt, new)
    # The first token from the prefill, then 6 per pass (5 accepted and one more).
    assert out.stats.target_forwards == 1 + -(-(new - 1) // 6)


class RecordingDrafter(EagleDrafter):
    """Records every (token, feature) pair the drafter's layer is fed."""

    def inputs(self, input_ids, features):
        self.fed.append((input_ids.clone(), features.clone()))  # [B, W], [B, W, H]
        return super().inputs(input_ids, features)


def test_every_committed_entry_pairs_a_hidden_state_with_the_next_token():
    target = tiny_lm("qwen2", seed=42)
    drafter = random_drafter(target, seed=3)
    recording = RecordingDrafter(drafter.config)
    recording.load_state_dict(drafter.state_dict())
    recording.fed = []
    prompts = [PROMPTS[0], PROMPTS[2]]
    ids, mask = left_padded(prompts)
    out = specdec.generate(target, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[], pad_token_id=2,
                           method=specdec.Eagle(recording, top_k=2, max_draft_tokens=3, adaptive=False))
    for b, p in enumerate(prompts):
        tokens = torch.cat([t[b].reshape(-1) for t, _ in recording.fed])
        features = torch.cat([f[b].reshape(-1, f.shape[-1]) for _, f in recording.fed])
        text = p + out.sequences[b, ids.shape[1]:].tolist()
        with torch.no_grad():
            hidden = target.model(torch.tensor([text])).last_hidden_state[0]
        # Which fed feature is the target's own at position t (the drafted ones are the drafter's).
        # (The loop's tree-attention passes and this plain forward round differently: ~3e-3 apart
        # here, where different positions are O(1) apart.)
        match = torch.cdist(features.float(), hidden.float()) < 0.05          # [fed, positions]
        assert bool((match.sum(1) <= 1).all())
        fed_at, t = match.nonzero(as_tuple=True)
        assert torch.equal(tokens[fed_at], torch.tensor(text)[t + 1]), "f_t fed with a token other than x_{t+1}"
        # Every position but the last (the root's hidden state is computed by the next pass)
        # was fed with the target's own.
        assert set(t.tolist()) >= set(range(len(text) - 1))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("tree", [None, "dynamic"])
def test_greedy_identity_ragged_batch(family, tree, device):
    target = tiny_lm(family, seed=43).to(device)
    method = specdec.Eagle(random_drafter(target, seed=1).to(device), tree=tree, top_k=3, max_draft_tokens=4)
    out = assert_greedy_identity(target, PROMPTS, method)
    assert out.stats.total_proposed > 0


def test_greedy_identity_reduced_vocabulary_and_eos():
    target = tiny_lm("llama", seed=44)
    eos = hf_greedy(target, PROMPTS[0], 24)[6]
    method = specdec.Eagle(random_drafter(target, draft_vocab_size=24), max_draft_tokens=4, adaptive=False)
    assert_greedy_identity(target, PROMPTS, method, eos=eos)


def test_greedy_identity_in_an_ensemble():
    # A member sees only its own nodes; the drafter still needs the hidden states of every
    # accepted token, which may be another member's.
    target = tiny_lm("llama", seed=45)
    method = specdec.Ensemble(specdec.PromptLookup(), specdec.Eagle(random_drafter(target), max_draft_tokens=3))
    assert_greedy_identity(target, PROMPTS, method)


def test_drafter_for_another_model_is_refused():
    target = tiny_lm("llama", seed=46)
    other = tiny_lm("llama", seed=46, hidden_size=32, intermediate_size=64)
    with pytest.raises(ValueError, match="hidden size 32"):
        specdec.generate(target, torch.tensor([PROMPTS[0]]), max_new_tokens=4,
                         method=specdec.Eagle(random_drafter(other)))
    wider = tiny_lm("llama", seed=46, vocab=128)
    with pytest.raises(ValueError, match="128 token ids"):
        specdec.generate(target, torch.tensor([PROMPTS[0]]), max_new_tokens=4,
                         method=specdec.Eagle(random_drafter(wider)))


def test_bad_arguments(tmp_path):
    drafter = random_drafter(tiny_lm("llama", seed=47))
    with pytest.raises(ValueError, match="tree"):
        specdec.Eagle(drafter, tree="static")
    with pytest.raises(ValueError, match="top_k"):
        specdec.Eagle(drafter, top_k=1)
    with pytest.raises(ValueError, match="max_draft_tokens"):
        specdec.Eagle(drafter, max_draft_tokens=0)
    with pytest.raises(TypeError, match="EagleDrafter"):
        specdec.Eagle(object())
    assert specdec.Eagle(drafter, num_speculative_tokens=3).max_draft_tokens == 3
    with pytest.raises(FileNotFoundError):
        EagleDrafter.load(tmp_path / "missing")
    drafter.save(tmp_path / "d")
    (tmp_path / "d" / "drafter.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="drafter.safetensors"):
        EagleDrafter.load(tmp_path / "d")


def test_saved_drafter_proposes_the_same(tmp_path):
    target = tiny_lm("qwen2", seed=48)
    drafter = random_drafter(target, seed=2)
    again = EagleDrafter.load(drafter.save(tmp_path / "d"))
    runs = [specdec.generate(target, torch.tensor([PROMPTS[2]]), max_new_tokens=16, eos_token_id=[],
                             method=specdec.Eagle(d, max_draft_tokens=3, adaptive=False)) for d in (drafter, again)]
    assert [a.tolist() for a in runs[0].stats.accepted] == [a.tolist() for a in runs[1].stats.accepted]
    assert torch.equal(runs[0].sequences, runs[1].sequences)


def test_fresh_drafter_of_a_prepared_target_and_in_its_dtype():
    # The layer is copied from the target's packed weights, and the drafter scores in the
    # target's dtype (a bf16 target's LM head rows).
    plain = tiny_lm("qwen2", seed=49)
    prepared = specdec.pack_linear_layers(tiny_lm("qwen2", seed=49))
    a, b = EagleDrafter.for_target(plain), EagleDrafter.for_target(prepared)
    for (name, x), (_, y) in zip(a.weights().items(), b.weights().items()):
        assert torch.equal(x, y), name
    q = a.layer.self_attn.q_proj.weight
    assert torch.equal(q, plain.model.layers[-1].self_attn.q_proj.weight)
    assert not a.layer.self_attn.o_proj.weight.any() and not a.layer.mlp.down_proj.weight.any()
    half = tiny_lm("llama", seed=50).to(torch.bfloat16)
    drafter = EagleDrafter.for_target(half)
    assert drafter.logits(torch.randn(2, 64)).dtype == torch.bfloat16
    method = specdec.Eagle(drafter, max_draft_tokens=3)
    ids = torch.tensor([PROMPTS[2]])
    want = specdec.generate(half, ids, max_new_tokens=12, eos_token_id=[])
    assert torch.equal(specdec.generate(half, ids, max_new_tokens=12, eos_token_id=[], method=method).sequences,
                       want.sequences)
