"""The EAGLE decoder on tiny models: the drafter's alignment with the target's hidden states
(an oracle drafter, and every committed entry pairing f_t with x_{t+1}), greedy identity (trees
and chains, ragged batches, ensembles, reduced vocabularies), bad input. The sampling
distribution, seeded equality, queues and finished rows run over support.decoding.METHODS."""

import dataclasses

import pytest
import torch
from support.clock import SyntheticClock
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


def test_oracle_drafter_over_a_scattered_vocabulary_is_accepted_whole():
    # The drafter's columns are not ids: each drafted column must become its id (vocab_ids[c])
    # before the target verifies it and the drafter embeds it.
    target = bigram_target()
    prompt, new = PROMPTS[0], 31
    greedy = hf_greedy(target, prompt, new)
    keep = torch.arange(target.config.vocab_size) % 2 == 0
    keep[greedy] = True
    vocab = keep.nonzero().flatten()
    vocab = vocab[torch.randperm(len(vocab), generator=torch.Generator().manual_seed(0))]  # any order
    drafter = oracle_drafter(target, vocab_ids=vocab)
    assert drafter.vocab_ids.tolist() == sorted(vocab.tolist()) and drafter.config.draft_vocab_size == len(vocab)
    method = specdec.Eagle(drafter, tree=None, max_draft_tokens=5, adaptive=False)
    out = specdec.generate(target, torch.tensor([prompt]), max_new_tokens=new, eos_token_id=[], method=method)
    assert out.sequences[0, len(prompt):].tolist() == greedy
    assert out.stats.target_forwards == 1 + -(-(new - 1) // 6)


class RecordingDrafter(EagleDrafter):
    """Records every (token, feature) pair the drafter's layer is fed."""

    def inputs(self, input_ids, features):
        self.fed.append((input_ids.clone(), features.clone()))  # [B, W], [B, W, H]
        return super().inputs(input_ids, features)


class Schedule:
    """Stands in for the proposer's `ShapeChoice`: the shapes in a fixed cycle; notes how many
    drafter inputs had been fed when each step chose."""

    def __init__(self, shapes, cycle, fed):
        self.shapes, self.cycle, self.fed = shapes, cycle, fed
        self.current, self.picks, self.fed_before = None, [], []

    def next(self):
        return self.cycle[len(self.picks) % len(self.cycle)]

    def choose(self, budgeted=False):
        # A step whose node budget was set keeps the full shape, untimed, as ShapeChoice does
        # ("none": a budget of no nodes, as pacing and ensembles give).
        pick = self.next()
        self.current = None if budgeted else self.shapes.index(pick)
        self.picks.append(pick)
        self.fed_before.append(len(self.fed))
        return self.current or 0

    def emitted(self, accept_len, live, contained=None):
        pass


class Watched(specdec.Eagle):
    """Eagle that notes whether each step drafted; given a ``cycle``, its steps take those
    shapes in turn ("none": a step given no nodes)."""

    cycle = None

    def start(self, *args):
        proposer = super().start(*args)
        if self.cycle:
            self.schedule = proposer.shape = Schedule(proposer.shape.shapes, self.cycle, self.drafter.fed)
        propose, self.drafted = proposer.propose, []

        def watched(ctx):
            if self.cycle and self.schedule.next() == "none":
                ctx = dataclasses.replace(ctx, max_nodes=0)
            proposal = propose(ctx)
            self.drafted.append(proposal.tokens.shape[1] > 1)
            return proposal

        proposer.propose = watched
        return proposer


class Scheduled(Watched):
    cycle = ("none", "none", "tree", "none", "chain", "tree", "none", "none", "none", "tree")


@pytest.mark.parametrize("schedule", [False, True], ids=["every-step-drafts", "root-only-steps"])
def test_every_committed_entry_pairs_a_hidden_state_with_the_next_token(schedule, monkeypatch):
    # With root-only steps the entries wait and are fed in one pass when the drafter next drafts.
    target = tiny_lm("qwen2", seed=42)
    # Passes priced flat on a synthetic clock: the adaptive shapes draft wherever a node may be
    # accepted, whatever the machine's load (measured times once made every shape draft nothing).
    SyntheticClock(target, target_ms=lambda tokens: 10.0).install(monkeypatch)
    drafter = random_drafter(target, seed=3)
    recording = RecordingDrafter(drafter.config)
    recording.load_state_dict(drafter.state_dict())
    recording.fed = []
    prompts = [PROMPTS[0], PROMPTS[2]]
    ids, mask = left_padded(prompts)
    method = (Scheduled if schedule else Watched)(recording, top_k=2, max_draft_tokens=3, adaptive=schedule)
    # (Without the batch's pacing, whose one-token steps would take the place of the cycle's;
    # rows stay in the batch when they stop, so that row b is prompt b in every recorded input
    # whichever row stops first.)
    out = specdec.generate(target, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[], pad_token_id=2,
                           method=method, batching=specdec.Batching(pace=False, drop_finished=False))
    # The entries of the steps after the last that drafted wait (for a draft that never comes).
    drafted = method.drafted
    waiting = len(drafted) - max(i + 1 for i, d in enumerate(drafted) if d)
    if schedule:
        picks, fed_before = method.schedule.picks, method.schedule.fed_before
        assert {"none", "chain", "tree"} <= set(picks)
        # A root-only step runs no drafter pass.
        assert all(fed_before[i + 1] == fed_before[i] for i in range(len(picks) - 1) if picks[i] == "none")
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
        # Every position but the last few (the root's hidden state is computed by the next
        # pass; entries of the steps since the last draft wait for the next) was fed with the
        # target's own.
        assert set(t.tolist()) >= set(range(len(text) - 1 - waiting))
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("tree", [None, "dynamic"])
def test_greedy_identity_ragged_batch(family, tree, adaptive, device):
    target = tiny_lm(family, seed=43).to(device)
    method = specdec.Eagle(random_drafter(target, seed=1).to(device), tree=tree, top_k=3, max_draft_tokens=4,
                           adaptive=adaptive)
    out = assert_greedy_identity(target, PROMPTS, method)
    if not adaptive:  # the adaptive shape drafts what measured times say pays: maybe nothing
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
    config = drafter.config
    for ids, message in ((torch.tensor([1, 2]), "2 vocab_ids for draft_vocab_size 96"),
                         (torch.arange(95, 191), "vocab_ids must lie in 0..95"),
                         (torch.cat([torch.arange(95), torch.tensor([3])]), "must not repeat an id")):
        with pytest.raises(ValueError, match=message):
            EagleDrafter(config, ids)


def test_a_drafter_saved_without_vocab_ids_scores_the_lowest_ids(tmp_path):
    # Files written before drafters kept their vocabulary.
    from safetensors.torch import load_file, save_file

    target = tiny_lm("llama", seed=47)
    path = random_drafter(target, draft_vocab_size=40).save(tmp_path / "d") / "drafter.safetensors"
    state = load_file(str(path))
    assert torch.equal(state.pop("vocab_ids"), torch.arange(40))
    save_file(state, str(path))
    loaded = EagleDrafter.load(tmp_path / "d")
    assert torch.equal(loaded.vocab_ids, torch.arange(40))
    assert_greedy_identity(target, PROMPTS[:2], specdec.Eagle(loaded, max_draft_tokens=3))


def test_saved_drafter_proposes_the_same(tmp_path):
    target = tiny_lm("qwen2", seed=48)
    drafter = random_drafter(target, seed=2, vocab_ids=torch.arange(0, target.config.vocab_size, 2))
    again = EagleDrafter.load(drafter.save(tmp_path / "d"))
    assert torch.equal(again.vocab_ids, drafter.vocab_ids)
    runs = [specdec.generate(target, torch.tensor([PROMPTS[2]]), max_new_tokens=16, eos_token_id=[],
                             method=specdec.Eagle(d, max_draft_tokens=3, adaptive=False)) for d in (drafter, again)]
    assert [a.tolist() for a in runs[0].stats.accepted] == [a.tolist() for a in runs[1].stats.accepted]
    assert torch.equal(runs[0].sequences, runs[1].sequences)


@pytest.mark.parametrize("kernel", ["specdec", "onednn"])
def test_fresh_drafter_of_a_prepared_target_and_in_its_dtype(kernel):
    # The layer is copied from the target's prepared weights (oneDNN's packed copy: the training
    # commands prepare the target so), and the drafter scores in the target's dtype (a bf16
    # target's LM head rows).
    plain = tiny_lm("qwen2", seed=49)
    prepared = specdec.pack_linear_layers(tiny_lm("qwen2", seed=49), specdec.PackingConfig(kernel=kernel))
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


def test_a_prepared_target_runs_its_drafter_on_specdecs_kernel(tmp_path):
    # Decoding on a prepared target prepares the drafter's linear layers too (DotLinear on the
    # same weights where specdec's kernel is built for this CPU; unchanged elsewhere): the same
    # output, the same drafts up to rounding, the same saved file.
    target = tiny_lm("qwen2", seed=51)
    prepared = specdec.pack_linear_layers(tiny_lm("qwen2", seed=51))
    drafter, plain = random_drafter(target, seed=3), random_drafter(target, seed=3)
    ids = torch.tensor([PROMPTS[1]])
    runs = [specdec.generate(t, ids, max_new_tokens=16, eos_token_id=[],
                             method=specdec.Eagle(d, max_draft_tokens=3, adaptive=False))
            for t, d in ((prepared, drafter), (target, plain))]
    kind = "DotLinear" if specdec.model.prepare.dot_kernel_pays() else "Linear"
    assert {type(m).__name__ for m in (drafter.fc, drafter.layer.mlp.down_proj, drafter.layer.self_attn.q_proj)} == {kind}
    assert type(plain.fc) is torch.nn.Linear  # a plain target leaves its drafter as it is
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    x, f = torch.randint(target.config.vocab_size, (1, 6)), torch.randn(1, 6, target.config.hidden_size)
    with torch.no_grad():  # the same drafts up to the products' rounding
        torch.testing.assert_close(drafter.logits(drafter(x, f)), plain.logits(plain(x, f)))
    again = EagleDrafter.load(drafter.save(tmp_path / "d"))
    for (name, x), (_, y) in zip(again.weights().items(), plain.weights().items()):
        assert torch.equal(x, y), name
