"""Methods that contain a simpler shape fall back to it per step where it emits more tokens per
ms (`specdec.loop.shape_choice`): a draft tree to its chain, lookahead to prompt lookup, an
ensemble to one member; and keep the full shape where that pays. A contained shape's tokens per
step come from every step containing it (each method tells what its contained shapes would have
accepted), its time from its own steps. Pass times come from a synthetic clock (no wall time
decides), outputs are checked against HF greedy."""

import copy

import pytest
import torch
from support.clock import SyntheticClock
from support.decoding import hf_greedy, PROMPTS
from support.models import bigram_target, cyclic_lm, oracle_drafter, perturbed, tiny_lm
from support.proposers import Recording

import specdec
from specdec.loop.cost_model import EXPLORE_EVERY
from specdec.loop.shape_choice import FAR_EVERY, MIN_SAMPLES, ShapeChoice


def recorded(monkeypatch, method, target_ms, draft_ms=3.0, prompt=PROMPTS[0], new=60) -> Recording:
    """``method``'s run on a synthetic clock (its drafts timed too), its steps and shapes
    recorded, its output checked."""
    target = tiny_lm("llama", seed=25)
    drafts = [model for model in method.models]
    clock = SyntheticClock(target, drafts, target_ms=target_ms, draft_ms=draft_ms).install(monkeypatch)
    recording = Recording(method)
    out = specdec.generate(target, torch.tensor([prompt]), max_new_tokens=new, method=recording, eos_token_id=[])
    clock.remove()
    assert out.sequences[0, len(prompt):].tolist() == hf_greedy(target, prompt, new, eos=[])
    return recording


def chosen_shapes(monkeypatch, method, target_ms, draft_ms=3.0, prompt=PROMPTS[0], new=60) -> list[int]:
    """The shape each step took (`recorded`)."""
    return recorded(monkeypatch, method, target_ms, draft_ms, prompt, new).shapes


def settled(shapes: list[int]) -> list[int]:
    """The shapes taken in the second half of the run (the estimates settled), exploration
    steps left out."""
    explore = EXPLORE_EVERY // 2
    return [s for i, s in enumerate(shapes) if i >= len(shapes) // 2 and (i + 1) % EXPLORE_EVERY != explore]


def same_draft():
    return perturbed(tiny_lm("llama", seed=25), 0.0, seed=0)


@pytest.mark.parametrize("target_ms, draft_ms", [(lambda t: 10.0 + 10.0 * t, 3.0), (lambda t: 10.0 + t, 40.0)])
def test_a_draft_tree_falls_back_to_its_chain(monkeypatch, target_ms, draft_ms):
    # Every extra node costs a tenth of a pass, or every draft pass four passes: the tree's
    # nodes and its draft passes over several nodes lose to the chain, which takes copies of
    # repeated text in fewer draft passes.
    method = specdec.DraftModel(same_draft(), tree="dynamic")
    shapes = chosen_shapes(monkeypatch, method, target_ms, draft_ms)
    assert shapes[: 2 * MIN_SAMPLES] == [0] * MIN_SAMPLES + [1] * MIN_SAMPLES
    assert len(shapes) > 16 and set(settled(shapes)) == {1}


def test_lookahead_falls_back_to_prompt_lookup(monkeypatch):
    # Passes cost 40 ms per token: the window's and the pool's nodes do not pay.
    shapes = chosen_shapes(monkeypatch, specdec.Lookahead(), lambda t: 10.0 + 40.0 * t, prompt=PROMPTS[2], new=80)
    assert len(shapes) > 16 and set(settled(shapes)) == {1}


def test_an_ensemble_falls_back_to_its_best_member(monkeypatch):
    # Steep costs: prompt lookup's nodes beside an exact draft's cost more than they add.
    method = specdec.Ensemble(specdec.PromptLookup(), specdec.DraftModel(same_draft()))
    shapes = chosen_shapes(monkeypatch, method, lambda t: 10.0 + 20.0 * t)
    assert len(shapes) > 16 and set(settled(shapes)) == {2}


def test_an_ensemble_keeps_the_union_where_it_pays(monkeypatch):
    # Nearly flat costs: the union emits the draft's tokens and lookup's copies in one pass, at
    # least as fast as the draft alone (measured within a hair of it: the union on most steps).
    method = specdec.Ensemble(specdec.PromptLookup(), specdec.DraftModel(same_draft()))
    shapes = settled(chosen_shapes(monkeypatch, method, lambda t: 10.0 + t))
    assert shapes.count(0) >= 2 * len(shapes) / 3


def test_methods_told_to_keep_their_shape_have_no_choice(monkeypatch):
    draft = same_draft()
    for method in (specdec.DraftModel(draft, tree="dynamic", adaptive=False, num_draft_tokens=3),
                   specdec.Lookahead(adaptive=False), specdec.Ensemble(specdec.PromptLookup(), adaptive=False),
                   specdec.Ensemble(specdec.PromptLookup()), specdec.DraftModel(draft)):
        assert set(chosen_shapes(monkeypatch, method, lambda t: 10.0 + t, new=12)) == {None}, method


def test_choice_rates_whole_steps_and_leaves_budgeted_ones_out():
    clock = [0.0]
    choice = ShapeChoice(("tree", "chain", "other"), clock=lambda: clock[0])
    live = torch.tensor([True, True, False])

    # Shape 1 emits 3 tokens per row in 10 ms, shape 0 two in 9 ms, shape 2 two in 20 ms
    # (the finished row's 9 accepted do not count).
    ms_of, accepted_of = {0: 9, 1: 10, 2: 20}, {0: 1, 1: 2, 2: 1}

    def step(budgeted=False, ms=None):
        shape = choice.choose(budgeted)
        clock[0] += (ms or ms_of[shape]) / 1e3
        choice.emitted(torch.tensor([accepted_of[shape]] * 2 + [9]), live)
        return shape

    assert MIN_SAMPLES == 1
    assert [step() for _ in range(3)] == [0, 1, 2]  # measuring: each shape one step in turn
    # Step 4 explores (halfway between the methods' own explorations): shape 0, within
    # CLEAR_MARGIN of the best; the 3rd shape's step closes here.
    assert step() == 0
    assert [round(m.value, 3) for m in choice.measured] == [0.222, 0.3, 0.1]
    # A budgeted step keeps the full shape and is not timed, whatever it took.
    assert step(budgeted=True, ms=1000) == 0
    assert step() == 1
    assert [m.ms.count for m in choice.measured] == [2, 1, 1]  # a step's time closes at the next choice
    # Exploration tries the other shapes in turn, halfway between the methods' own explorations:
    # shape 0 on each of its turns, shape 2 (three times slower than the best) on one of
    # FAR_EVERY of its turns.
    picks = [step() for _ in range(4 * FAR_EVERY * EXPLORE_EVERY)]
    explored = [(choice.steps - len(picks) + 1 + i, p) for i, p in enumerate(picks) if p != 1]
    assert {s % EXPLORE_EVERY for s, _ in explored} == {EXPLORE_EVERY // 2}
    assert [p for _, p in explored].count(0) == 2 * FAR_EVERY and [p for _, p in explored].count(2) == 2
    # A step slowed by something else (a joining row's prefill) counts as at most OUTLIER times it.
    before = choice.measured[1].ms.value
    assert step(ms=10_000) == 1
    step()
    assert choice.measured[1].ms.value <= 1.2 * before


def test_a_contained_shapes_yield_comes_from_every_step_containing_it_its_time_from_its_own():
    clock = [0.0]
    choice = ShapeChoice(("tree", "chain"), clock=lambda: clock[0])
    tree, chain = choice.measured
    live = torch.tensor([True, True, False])

    # A tree step takes 14 ms and accepts 4 candidates (5 tokens), the chain's nodes within it
    # ``within``; a chain step takes 10 ms and accepts 2 (3 tokens). The finished row's 9
    # accepted do not count.
    def step(within=1, budgeted=False):
        shape = choice.choose(budgeted)
        clock[0] += (14 if shape == 0 else 10) / 1e3
        accepted = [4, 4, 9] if shape == 0 else [2, 2, 9]
        choice.emitted(torch.tensor(accepted), live, {1: torch.tensor([within, within, 0])} if shape == 0 else None)
        return shape

    assert step() == 0  # the tree's measuring step gives the chain's yield too: 2 tokens per row
    assert (chain.tokens.count, chain.tokens.value, chain.ms.count, chain.value) == (1, 2.0, 0, None)
    assert step() == 1  # the chain's step gives its time (and its own yield)
    assert step() == 0 and (chain.tokens.count, round(chain.tokens.value, 2), chain.ms.value) == (3, 2.33, 10.0)
    # A budgeted step gives no yields.
    assert step(within=4, budgeted=True) == 0 and chain.tokens.count == 3
    # Tree steps where the chain within takes all 4: the choice moves to the chain without any
    # chain step in between, its time still its own step's.
    shapes = [step(within=4) for _ in range(4)]
    assert shapes == [0, 0, 0, 1] and (chain.ms.count, chain.ms.value) == (1, 10.0)
    assert tree.ms.count == 5 and tree.ms.value == pytest.approx(14.0)

    # While the tree is the faster, the chain (whose yield its steps give) is tried only to
    # refresh its time: on one in FAR_EVERY of its turns, where a shape whose yield is not
    # given is tried on each (test_choice_rates_whole_steps_and_leaves_budgeted_ones_out).
    choice = ShapeChoice(("tree", "chain"), clock=lambda: clock[0])
    shapes = [step() for _ in range(2 * FAR_EVERY * EXPLORE_EVERY)]
    tried = [i + 1 for i, shape in enumerate(shapes) if shape == 1]
    cycle = FAR_EVERY * EXPLORE_EVERY
    assert tried == [2, cycle - EXPLORE_EVERY // 2, 2 * cycle - EXPLORE_EVERY // 2]


def greedy_accepts(tokens: list[int], parents: list[int], keep: list[bool], continuation: list[int]) -> int:
    """How many of the nodes ``keep`` the target's greedy ``continuation`` accepts, from the
    root (node 0) down: a tree verified by hand."""
    node, count = 0, 0
    for token in continuation:
        node = next((c for c in range(1, len(tokens))
                     if parents[c] == node and keep[c] and tokens[c] == token), None)
        if node is None:
            return count
        count += 1
    return count


def draft_chain(reference):
    """DraftModel: a tree step tells what the draft's greedy chain (as deep as the tree has it)
    takes; ``reference``: a copy of the draft for plain forward passes."""
    def expected(proposer, proposal, committed, continuation, accepted):
        if proposer.shape.current != 0:
            return {}
        tokens, parents = proposal.tokens[0].tolist(), proposal.parents[0].tolist()
        on_chain, node = [False] * len(tokens), 0
        for token in hf_greedy(reference, committed, 16, eos=[]):
            node = next((c for c in range(1, len(tokens)) if parents[c] == node and tokens[c] == token), None)
            if node is None:
                break
            on_chain[node] = True
        return {1: greedy_accepts(tokens, parents, on_chain, continuation)}
    return expected


def eagle_shapes(proposer, proposal, committed, continuation, accepted):
    """Eagle: a tree step tells what its chain of first choices (greedy: each node's most
    probable child, listed first) takes."""
    shapes = proposer.shape.shapes
    name = shapes[proposer.shape.current]
    out = {}
    if name == "tree":
        tokens, parents = proposal.tokens[0].tolist(), proposal.parents[0].tolist()
        first = [c > 0 and parents[c] not in parents[1:c] for c in range(len(tokens))]
        out[shapes.index("chain")] = greedy_accepts(tokens, parents, first, continuation)
    return out


def lookup_alone(proposer, proposal, committed, continuation, accepted):
    """Lookahead: a lookahead step tells what prompt lookup's chains (the same in both shapes) take."""
    if proposer.shape.current != 0:
        return {}
    chains = [] if proposer.lookup.proposed is None else proposer.lookup.proposed[0].tolist()
    prefix = (next((i for i, (a, b) in enumerate(zip(c, continuation)) if a != b), len(c)) for c in chains)
    return {1: max(prefix, default=0)}


def members_alone(proposer, proposal, committed, continuation, accepted):
    """Ensemble: a union step tells what each member that proposed in it takes of its own tree;
    a step of the draft alone, what prompt lookup's chain would have taken, as far as the step
    committed (``accepted`` candidates and one more)."""
    if proposer.shape.current != 0:
        return {j + 1: min(greedy_accepts([-1, *chain[0].tolist()], list(range(-1, chain.shape[1])),
                                          [True] * (chain.shape[1] + 1), continuation), accepted + 1)
                for j, chain, _ in proposer.shadows}
    return {j + 1: greedy_accepts(p.tokens[0].tolist(), p.parents[0].tolist(), p.is_candidate()[0].tolist(),
                                  continuation)
            for j, p in enumerate(proposer.proposals) if proposer.called[j]}


def draft_tree():
    target = cyclic_lm()
    draft = perturbed(target, 0.05, 4)
    return target, specdec.DraftModel(draft, tree="dynamic", top_k=3), draft_chain(copy.deepcopy(draft))


def eagle():
    target = bigram_target()
    return target, specdec.Eagle(oracle_drafter(target, noise=0.3), top_k=3, max_draft_tokens=4), eagle_shapes


def lookahead():
    return cyclic_lm(), specdec.Lookahead(), lookup_alone


def ensemble():
    target = cyclic_lm()
    return target, specdec.Ensemble(specdec.PromptLookup(), specdec.DraftModel(perturbed(target, 0.05, 4))), members_alone


@pytest.mark.parametrize("setup, fewer", [(draft_tree, True), (eagle, False), (lookahead, False), (ensemble, True)])
def test_each_method_tells_what_its_contained_shapes_would_have_accepted(monkeypatch, setup, fewer):
    # Shapes drawn at random; at every step, what the method tells its ShapeChoice the shapes
    # within the step's would have accepted is what the target's greedy continuation takes of
    # their nodes (found by hand from the step's proposal).
    target, method, expected = setup()
    gen = torch.Generator().manual_seed(0)

    def random_shape(self, budgeted=False):
        self.current = None if budgeted else int(torch.randint(len(self.shapes), (1,), generator=gen))
        return self.current or 0

    prompt, new = PROMPTS[2], 48
    text = prompt + hf_greedy(target, prompt, new + 32, eos=[])
    recording, told, shadowed, emitted = Recording(method), [], [], ShapeChoice.emitted

    def spy(self, accept_len, live, contained=None, bounds=None):
        if self is recording.proposer.shape:
            committed, proposal = recording.steps[-1][0][0], recording.steps[-1][1]
            both = {**(contained or {}), **(bounds or {})}
            shadowed.extend(int(v[0]) for v in (bounds or {}).values())
            told.append(({k: int(v[0]) for k, v in both.items()}, int(accept_len[0]),
                         expected(recording.proposer, proposal, committed, text[len(committed):], int(accept_len[0]))))
        emitted(self, accept_len, live, contained, bounds)

    monkeypatch.setattr(ShapeChoice, "choose", random_shape)
    monkeypatch.setattr(ShapeChoice, "emitted", spy)
    specdec.generate(target, torch.tensor([prompt]), max_new_tokens=new, method=recording, eos_token_id=[])
    assert len(told) > 8 and [t for t, _, _ in told] == [want for _, _, want in told]
    # Not vacuous: the contained shapes took candidates; in a tree, its other branches (in a
    # union, the other member) took more on some steps.
    accepted = [(v, n) for t, n, _ in told for v in t.values()]
    assert any(v > 0 for v, _ in accepted) and (not fewer or any(v < n for v, n in accepted))
    # An ensemble's draft-alone steps tell what lookup's shadow chain would have taken.
    assert (setup is ensemble) == any(v > 0 for v in shadowed)


def test_an_eagle_drafter_that_does_not_pay_drafts_next_to_nothing(monkeypatch):
    # An untrained drafter, every extra node a tenth of a pass: neither its tree nor its chain
    # pays. It settles on the chain (shape 1), which its calibrated sizing keeps at no nodes on
    # most steps (it retries as the calibration decays to its prior).
    from support.models import random_drafter

    recording = recorded(monkeypatch, specdec.Eagle(random_drafter(tiny_lm("llama", seed=25))),
                         lambda t: 10.0 + 10.0 * t)
    assert len(recording.shapes) > 16 and set(settled(recording.shapes)) == {1}
    later = [step[1].tokens.shape[1] - 1 for step in recording.steps[len(recording.steps) // 2:]]
    assert sum(n == 0 for n in later) >= 3 * len(later) // 4, later


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_any_sequence_of_shapes_keeps_the_output_exact(monkeypatch, seed):
    # The shapes a method takes depend on measured times: whatever they are, step after step
    # (here drawn at random), every row's greedy output is the target's, with ragged batches.
    from support.decoding import assert_greedy_identity
    from support.models import random_drafter

    gen = torch.Generator().manual_seed(seed)

    def random_shape(self, budgeted=False):
        self.current = None if budgeted else int(torch.randint(len(self.shapes), (1,), generator=gen))
        return self.current or 0

    monkeypatch.setattr(ShapeChoice, "choose", random_shape)
    target = tiny_lm("llama", seed=43)
    draft = perturbed(target, 0.05, 4)
    for method in (specdec.DraftModel(draft, tree="dynamic", top_k=3), specdec.Lookahead(),
                   specdec.Eagle(random_drafter(target, seed=1), top_k=3, max_draft_tokens=4),
                   specdec.Ensemble(specdec.PromptLookup(), specdec.DraftModel(draft), specdec.Lookahead())):
        assert_greedy_identity(target, PROMPTS, method)
        assert_greedy_identity(target, PROMPTS[2:3], method)


def test_bounds_count_as_yields_without_making_a_shape_contained():
    # A draft-alone step of an ensemble tells at least what lookup alone would have emitted: its
    # yield, but lookup's own steps are still tried on each of its turns (not only for time).
    clock = [0.0]
    choice = ShapeChoice(("union", "lookup", "draft"), clock=lambda: clock[0])
    live = torch.tensor([True, True])
    for _ in range(3):
        choice.choose()
        choice.current = 2  # the draft alone
        clock[0] += 0.01
        choice.emitted(torch.tensor([3, 1]), live, None, {1: torch.tensor([4, 0])})
    lookup = choice.measured[1]
    assert (lookup.tokens.count, lookup.tokens.value, lookup.ms.count) == (3, 3.0, 0)
    assert choice.contains[2] == set()
