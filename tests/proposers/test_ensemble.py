"""Ensembles: the trie of several proposers' trees, what each member learns after a step, every
node of a merged pass (lookahead's window included) computing a plain forward over what it
sees, greedy identity (union fixed and adaptive, average; B = 4 ragged with EOS), node budgets
of every method, the adaptive cascade, bad arguments (falling back to one member:
test_shape_choice.py). The sampling distribution test is in
loop/test_decoders.py (support.decoding.METHODS)."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from support.clock import SyntheticClock
from support.decoding import assert_greedy_identity, hf_greedy, PROMPTS
from support.models import perturbed, tiny_lm
from support.ops import assert_all_raise, random_parents
from support.proposers import assert_nodes_compute_what_they_see, oracle_setup, random_heads, Recorder, Recording

import specdec
from specdec import Proposal, StepResult
from specdec.loop.cost_model import EXPLORE_EVERY
from specdec.loop.shape_choice import MIN_SAMPLES as SHAPE_SAMPLES
from specdec.proposers.ensemble import MIN_SAMPLES, member_steps, merge_proposals
from specdec.proposers.merge import merge_paths


def paths_of(tokens: list[int], parents: list[int]) -> list[tuple[int, ...]]:
    """Each node's token path from the root (None for padding)."""
    out = []
    for i, t in enumerate(tokens):
        if t < 0:
            out.append(None)
            continue
        path, j = [], i
        while j >= 0:
            path.append(tokens[j])
            j = parents[j] if j else -1
        out.append(tuple(reversed(path)))
    return out


def random_forest(gen, B=3, trees=3, size=7, vocab=4):
    """Several random trees over one root per row, concatenated (small vocabulary: many equal
    paths), some nodes padding (-1, with padding below them)."""
    tokens, parents = [], []
    for _ in range(B):
        row_t, row_p = [9], [-1]
        for _ in range(trees):
            offset = len(row_t) - 1
            par = random_parents(size, gen)
            tok = torch.randint(0, vocab, (size,), generator=gen).tolist()
            for i in range(1, size):
                pad = row_t[offset + par[i]] < 0 if par[i] else torch.rand(1, generator=gen).item() < 0.1
                row_t.append(-1 if pad else tok[i])
                row_p.append(offset + par[i] if par[i] else 0)
        tokens.append(row_t)
        parents.append(row_p)
    return torch.tensor(tokens), torch.tensor(parents)


def test_merge_paths_makes_a_trie_of_the_same_paths():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        tokens, parents = random_forest(gen)
        merged, merged_parents, index = merge_paths(tokens, parents)
        for b in range(tokens.shape[0]):
            before = paths_of(tokens[b].tolist(), parents[b].tolist())
            after = paths_of(merged[b].tolist(), merged_parents[b].tolist())
            real = [p for p in after if p is not None]
            assert len(real) == len(set(real)) == len({p for p in before if p is not None})
            assert all(p is None for p in after[len(real):])  # padding at the end
            assert all(0 <= q < i for i, q in enumerate(merged_parents[b].tolist()[1:len(real)], 1))
            for i, p in enumerate(before):  # each node went to the node with its path
                assert (index[b, i] == -1) if p is None else after[int(index[b, i])] == p


def chain(root: int, *tokens: int) -> Proposal:
    t = torch.tensor([[root, *tokens]])
    return Proposal(t, torch.arange(-1, len(tokens))[None])


def test_member_steps_are_each_members_own_view():
    # Members: a chain 1-2-3, a tree {1-2-4, 5}, a chain 1-7. The target takes 1, 2, 4, then 8.
    a = chain(0, 1, 2, 3)
    b = Proposal(torch.tensor([[0, 1, 5, 2, 4]]), torch.tensor([[-1, 0, 0, 1, 3]]))
    c = chain(0, 1, 7)
    merged, index, added = merge_proposals([a, b, c], torch.tensor([10]))
    assert merged.tokens.tolist() == [[0, 1, 2, 3, 5, 4, 7]]
    assert added == [3, 2, 1]
    assert [i.tolist() for i in index] == [[[0, 1, 2, 3]], [[0, 1, 4, 2, 5]], [[0, 1, 6]]]
    V, H = 11, 3
    logits, hidden = torch.randn(1, 7, V), torch.randn(1, 7, H)
    path = torch.tensor([[0, 1, 2, 5, -1]])  # root, 1, 2, 4
    step = StepResult(merged, path, torch.tensor([3]), torch.tensor([8]), logits, hidden)
    own = member_steps(step, [a, b, c], index)
    assert [s.accept_path.tolist() for s in own] == [[[0, 1, 2, -1, -1]], [[0, 1, 3, 4, -1]], [[0, 1, -1, -1, -1]]]
    assert [s.accept_len.tolist() for s in own] == [[2], [3], [1]]
    # After its last accepted node: the step's next node (4, 2) or the step's own next token.
    assert [s.next_token.tolist() for s in own] == [[4], [8], [2]]
    for s, p, i in zip(own, (a, b, c), index):
        assert s.proposal is p
        assert torch.equal(s.logits, logits[:, i[0]]) and torch.equal(s.hidden, hidden[:, i[0]])
        assert torch.equal(s.hidden_at_last(), hidden[:, 5])  # the step's, not the member's


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_every_members_nodes_compute_what_they_see(family):
    # Lookahead's window (non-candidates with their own mask and positions) and its trie nodes,
    # merged with prompt lookup's and a draft's: each member's logits, in its own numbering,
    # against a plain forward over what its node sees.
    target = tiny_lm(family, seed=21)
    look = Recorder(specdec.Lookahead(window=3, ngram=3, guess_set=3, adaptive=False))
    lookup = Recording(specdec.PromptLookup(adaptive=False, num_draft_tokens=3))
    draft = Recording(specdec.DraftModel(perturbed(target, 0.1, 3), 3))
    method = specdec.Ensemble(lookup, look, draft, adaptive=False)
    max_new = 16
    assert_greedy_identity(target, PROMPTS[:2], method, max_new=max_new)

    def live(committed):  # finished rows are computed but never committed: skip those steps
        return all(len(row) < len(p) + max_new for row, p in zip(committed, PROMPTS))

    look.steps = [s for s in look.steps if live(s[0])]
    assert len(look.steps) >= 5
    assert assert_nodes_compute_what_they_see(target, look, 10) == {"root", "window", "candidate"}
    for member in (lookup, draft):
        steps = [[c, with_tree_layout(p, c), step.logits, None] for c, p, _, step in member.steps if live(c)]
        assert assert_nodes_compute_what_they_see(target, SimpleNamespace(steps=steps), 10) == {"root", "candidate"}


def with_tree_layout(proposal: Proposal, committed: list[list[int]]) -> Proposal:
    """A tree proposal with its mask, positions and candidates written out."""
    mask, depth, _ = specdec.ops.build_tree(proposal.parents, max_leaves=1, max_depth=0)
    root = torch.tensor([[len(row) - 1] for row in committed])
    return dataclasses.replace(proposal, attention_mask=mask, position_ids=root + depth,
                               candidates=proposal.tokens >= 0)


def lookup_and_draft(target, adaptive=True, **draft):
    return specdec.Ensemble(specdec.PromptLookup(), specdec.DraftModel(perturbed(target, 0.05, 4), 3, **draft),
                            adaptive=adaptive)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("adaptive", [False, True])
def test_union_greedy_identity_ragged_with_eos(family, adaptive, device):
    target = tiny_lm(family, seed=22).to(device)
    eos = hf_greedy(target, PROMPTS[0], 24, eos=[])[6]
    method = specdec.Ensemble(specdec.PromptLookup(), specdec.DraftModel(perturbed(target, 0.05, 4).to(device), 3),
                              specdec.Lookahead(window=2, ngram=3, guess_set=2), adaptive=adaptive)
    out = assert_greedy_identity(target, PROMPTS, method, eos=eos)
    assert out.stats.total_accepted > 0


def test_average_greedy_identity_and_mixture():
    target = tiny_lm("qwen2", seed=23)
    drafts = [perturbed(target, 0.05, s) for s in (1, 2)]
    method = specdec.Ensemble(*(specdec.DraftModel(d, 4, draft_vocab_size=h) for d, h in zip(drafts, (90, 96))),
                              mix="average")
    rec = Recording(method)
    out = assert_greedy_identity(target, PROMPTS, rec)
    assert out.stats.total_accepted > 0
    # The chain is the argmax of the mean of the drafts' probabilities over the shared ids.
    committed, proposal, _, _ = rec.steps[0]
    row = committed[1]
    with torch.no_grad():
        probs = [d(torch.tensor([row])).logits[0, -1, :90].softmax(-1) for d in drafts]
    assert int(proposal.tokens[1, 1]) == int((probs[0] + probs[1]).argmax())


def test_medusa_member_reads_the_hidden_state_at_the_true_last_node():
    # Oracle heads find the position of the hidden state they are given: with the member's own
    # last node instead of the step's, they would propose for the wrong position.
    target, prompt, future, oracle = oracle_setup()
    medusa = specdec.Medusa(oracle, tree=[(0,), (0, 0), (0, 0, 0), (1,)])
    method = specdec.Ensemble(specdec.PromptLookup(adaptive=False, num_draft_tokens=2), medusa, adaptive=False)
    out = specdec.generate(target, torch.tensor([prompt]), max_new_tokens=24, eos_token_id=[], method=method)
    assert out.sequences[0, len(prompt):].tolist() == future
    assert out.stats.target_forwards <= 1 + -(-23 // 4)  # every step takes the heads' 3-deep chain


class Capped(Recording):
    """A method whose proposer is given a node budget every step."""

    def __init__(self, inner, budget):
        super().__init__(inner)
        self.budget = budget

    def propose(self, ctx):
        return super().propose(dataclasses.replace(ctx, max_nodes=self.budget))


@pytest.mark.parametrize("budget", [0, 1, 3])
def test_every_method_keeps_to_a_node_budget(budget):
    target = tiny_lm("llama", seed=24)
    draft = perturbed(target, 0.05, 4)
    methods = [specdec.PromptLookup(adaptive=False, num_draft_tokens=5), specdec.PromptLookup(),
               specdec.DraftModel(draft, 5), specdec.DraftModel(draft, adaptive=True),
               specdec.DraftModel(draft, 3, tree="dynamic", top_k=3), specdec.DraftModel(draft, adaptive=True, tree="dynamic", top_k=2),
               specdec.Medusa(random_heads(target), tree=[(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]),
               specdec.Medusa(random_heads(target), tree="dynamic", max_draft_tokens=6, top_k=3),
               specdec.Lookahead(window=3, ngram=3, guess_set=3, adaptive=False), specdec.Lookahead(),
               lookup_and_draft(target)]
    for method in methods:
        capped = Capped(method, budget)
        assert_greedy_identity(target, PROMPTS, capped, max_new=12)
        sizes = [int((p.tokens[:, 1:] >= 0).sum(1).max()) for _, p, _, _ in capped.steps]
        assert max(sizes) <= budget, (method, sizes)
        # Adaptive methods size their nodes on measured pass times, which may rule everything
        # out on a loaded machine: only fixed sizes must propose something under a budget.
        if budget and not getattr(method, "adaptive", False):
            assert max(sizes) > 0, method


def test_adaptive_cascade_skips_a_member_that_does_not_pay(monkeypatch):
    # A draft that never agrees, after prompt lookup: once measured (the union and each member
    # alone a few steps each, `shape_choice`; in the union, a few steps in each state: lookup
    # proposed something or not) it drafts only on exploration steps (the cascade's, every
    # EXPLORE_EVERY, and the shapes', halfway between). Passes cost what the profile says,
    # 10 ms + 1 ms per token, and a draft pass 3 ms (a synthetic clock: no wall time decides).
    target = tiny_lm("llama", seed=25)
    strange_draft, same_draft = tiny_lm("llama", seed=123), perturbed(target, 0.0, seed=0)
    SyntheticClock(target, [strange_draft, same_draft]).install(monkeypatch)
    stranger = Recording(specdec.DraftModel(strange_draft, 3))
    method = specdec.Ensemble(specdec.PromptLookup(), stranger)
    costs = {k: 10.0 + k for k in range(1, 40)}
    out = specdec.generate(target, torch.tensor([PROMPTS[0]]), max_new_tokens=40, method=method,
                           pass_costs=costs, eos_token_id=[])
    assert out.sequences[0, len(PROMPTS[0]):].tolist() == hf_greedy(target, PROMPTS[0], 40, eos=[])
    called = [budget != 0 for _, _, budget, _ in stranger.steps]
    explored = [(i + 1) % EXPLORE_EVERY in (0, EXPLORE_EVERY // 2) for i in range(len(called))]
    measuring = 3 * SHAPE_SAMPLES  # the union, lookup alone, the draft alone
    assert len(called) >= 16 and called[0]
    assert sum(c and not e for c, e in zip(called[measuring:], explored[measuring:])) <= 2 * MIN_SAMPLES
    # A draft that always agrees keeps drafting (in the union or alone), but where lookup
    # alone is measured or explored.
    agreeing = Recording(specdec.DraftModel(same_draft, 3))
    specdec.generate(target, torch.tensor([PROMPTS[0]]), max_new_tokens=40, eos_token_id=[], pass_costs=costs,
                     method=specdec.Ensemble(specdec.PromptLookup(), agreeing))
    drafted = [budget != 0 for _, _, budget, _ in agreeing.steps]
    assert all(d for i, d in enumerate(drafted[measuring:], start=measuring)
               if (i + 1) % EXPLORE_EVERY != EXPLORE_EVERY // 2)


def test_sampled_union_is_the_one_token_decoding_with_the_same_seed():
    target = tiny_lm("llama", seed=26)
    ids = torch.tensor([PROMPTS[0], PROMPTS[2][:6]])

    def sample(method):
        return specdec.generate(target, ids, max_new_tokens=16, do_sample=True, temperature=0.9, method=method,
                                generator=torch.Generator().manual_seed(3), eos_token_id=[]).sequences

    assert torch.equal(sample(lookup_and_draft(target)), sample(None))


def test_bad_arguments():
    target = tiny_lm("llama", seed=27)
    draft = perturbed(target, 0.05, 4)
    other_vocab = tiny_lm("llama", seed=1, vocab=80)
    ids = torch.tensor([[1, 2, 3]])
    assert_all_raise([
        ("empty", lambda: specdec.Ensemble(), "no members"),
        ("not a method", lambda: specdec.Ensemble(specdec.PromptLookup(), draft), "not a method"),
        ("mix", lambda: specdec.Ensemble(specdec.PromptLookup(), mix="vote"), "mix must be"),
        ("average of non-drafts", lambda: specdec.Ensemble(specdec.DraftModel(draft), specdec.PromptLookup(),
                                                           mix="average"), "PromptLookup"),
        ("average, settings differ", lambda: specdec.Ensemble(specdec.DraftModel(draft, 3), specdec.DraftModel(draft, 4),
                                                              mix="average"), "num_draft_tokens"),
        ("union over another tokenizer", lambda: specdec.generate(
            target, ids, method=specdec.Ensemble(specdec.PromptLookup(), specdec.DraftModel(other_vocab))),
         "token ids"),
        ("average over another tokenizer", lambda: specdec.generate(
            target, ids, method=specdec.Ensemble(specdec.DraftModel(draft), specdec.DraftModel(other_vocab),
                                                 mix="average")), "token ids"),
        ("stochastic drafts in a union", lambda: specdec.generate(
            target, ids, do_sample=True, method=specdec.Ensemble(specdec.PromptLookup(),
                                                                 specdec.DraftModel(draft, coupled=False))),
         "coupled=True"),
    ])


class PricedFor(Recording):
    """A member that records the other nodes its proposal was sized to share a pass with."""

    def __init__(self, inner):
        super().__init__(inner)
        self.extra = []

    def propose(self, ctx):
        self.extra.append(ctx.costs.extra)
        return super().propose(ctx)


def test_a_member_alone_is_sized_for_a_pass_of_its_own():
    # On the steps prompt lookup proposes alone (the shape choice's measuring step and
    # explorations) the draft proposes nothing: lookup's chain is sized for a pass without the
    # draft's nodes of the step before; on the union's steps it shares the pass with them.
    # (Steps are classified by the shape chosen, not by the draft's budget: the cascade may also
    # skip the draft in a union step, after lookup has proposed, from its measured ms.)
    target = tiny_lm("llama", seed=25)
    lookup = PricedFor(specdec.PromptLookup())
    drafting = Recording(specdec.DraftModel(perturbed(target, 0.0, seed=0), 4))
    ensemble = Recording(specdec.Ensemble(lookup, drafting))
    out = specdec.generate(target, torch.tensor([PROMPTS[0]]), max_new_tokens=40, eos_token_id=[],
                           method=ensemble, pass_costs={k: 10.0 + k for k in range(1, 40)})
    assert out.sequences[0, len(PROMPTS[0]):].tolist() == hf_greedy(target, PROMPTS[0], 40, eos=[])
    assert len(ensemble.shapes) == len(lookup.extra) == len(drafting.steps)
    alone = [extra for extra, shape in zip(lookup.extra, ensemble.shapes) if shape == 1]
    in_union = [extra for extra, shape, (_, _, draft_budget, *_) in zip(lookup.extra, ensemble.shapes, drafting.steps)
                if shape == 0 and draft_budget != 0]
    assert alone and all(extra == 0 for extra in alone), alone
    assert any(extra > 0 for extra in in_union[1:])  # in the union it prices the draft's nodes
